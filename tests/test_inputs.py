"""Datasets and weights files a config names are checked before any job is scheduled (pipeline.inputs).

Each missing input is one ConfigError line naming the config key and the path expected; the check
passes once tiny stand-ins exist in the layout the consumers read (tests/datasets.py writes them).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from pipeline.config import ConfigError, validate_config
from pipeline.inputs import check_inputs_exist
from tests.datasets import make_idx_split, write_idx, write_image_folder


def _inputs_error(config: dict) -> str:
    """The one line check_inputs_exist raises for ``config`` (validated first)."""
    with pytest.raises(ConfigError) as err:
        check_inputs_exist(validate_config(config))
    message = str(err.value)
    assert "\n" not in message
    return message


def _inputs_pass(config: dict) -> None:
    check_inputs_exist(validate_config(config))


def test_a_private_dataset_missing_from_data_root_is_one_line_naming_the_keys_and_the_path(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    message = _inputs_error({"data": {"data_root": str(root), "private": {"source": "mnist"}}})
    assert message.startswith("config error at data.private.source: MNIST not found: looked in "
                              f"{root / 'MNIST' / 'raw'} for train-images-idx3-ubyte")
    assert "set data.data_root" in message


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_the_check_passes_with_a_tiny_mnist_in_torchvisions_layout(tmp_path, gz):
    rng = np.random.default_rng(0)
    write_idx(tmp_path / "MNIST" / "raw", make_idx_split(rng, 3), make_idx_split(rng, 2), gz=gz)
    _inputs_pass({"data": {"data_root": str(tmp_path), "private": {"source": "mnist"}}})


def test_a_public_source_on_disk_is_checked_too(tmp_path):
    message = _inputs_error({"data": {"data_root": str(tmp_path), "public": {"source": "kmnist"}}})
    assert message.startswith(f"config error at data.public.source: KMNIST not found: looked in {tmp_path}/KMNIST/raw")


def test_a_missing_image_folder_is_one_line_naming_its_key_and_path(tmp_path):
    folder = tmp_path / "ffhq"
    public = {"source": "image_folder", "path": str(folder)}
    message = _inputs_error({"data": {"public": public}})
    assert message.startswith(f"config error at data.public.path: image folder not found: looked for the directory "
                              f"{folder}; ")
    assert _inputs_error({"data": {"public": {"source": "image_folder"}}}) == (
        "config error at data.public.path: expected a folder of class sub-folders for source image_folder, got null")

    write_image_folder(folder, np.zeros((2, 3, 4, 4), dtype=np.uint8), np.array([0, 1]))
    _inputs_pass({"data": {"public": public}})


def test_straightdp_public_is_checked_only_when_straightdp_is_chosen(tmp_path):
    folder = tmp_path / "letters"
    config = {"straightdp": {"public": {"source": "image_folder", "path": str(folder)}}}
    assert _inputs_error({**config, "methods": ["straightdp"]}).startswith(
        f"config error at straightdp.public.path: image folder not found: looked for the directory {folder}; ")
    _inputs_pass({**config, "methods": ["dpdm"]})


def test_missing_weights_files_are_one_line_naming_their_key_and_path(tmp_path, monkeypatch):
    weights = tmp_path / "weights.bin"
    clip = {"clip": {"source": "pretrained", "pretrained_model": "ViT-B-32", "pretrained_path": str(weights),
                     "class_names": ["zero", "one"]}}
    assert _inputs_error({"evaluation": clip}).startswith(
        f"config error at evaluation.clip.pretrained_path: {weights} not found: ")
    zero_shot = {"model": "ViT-B-32", "checkpoint": str(weights), "class_names": ["zero"]}
    diagnostics = {"methods": ["empden_diagnostics"], "empden_diagnostics": {"clip": zero_shot}}
    assert _inputs_error(diagnostics).startswith(
        f"config error at empden_diagnostics.clip.checkpoint: no file at {weights} ")
    inception = {"evaluation": {"feature_extractor": "inception-v3-compat", "inception_weights": str(weights)}}
    assert _inputs_error(inception).startswith(
        f"config error at evaluation.inception_weights: inception-v3-compat weights not found at {weights}: ")
    # null: the torch hub cache, where torch-fidelity would have put them
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    inception_default = {"evaluation": {"feature_extractor": "inception-v3-compat"}}
    assert f"not found at {tmp_path}/torch/hub/checkpoints/weights-inception-" in _inputs_error(inception_default)

    weights.write_bytes(b"stand-in")  # presence is all that is checked; the stage parses the file
    for config in ({"evaluation": clip}, diagnostics, inception):
        _inputs_pass(config)


def test_unused_weights_keys_are_not_checked(tmp_path):
    missing = str(tmp_path / "absent.pt")
    _inputs_pass({"evaluation": {"clip": {"pretrained_path": missing}, "inception_weights": missing}})  # source trained
    _inputs_pass({"methods": ["dpdm"], "empden_diagnostics": {"clip": {"model": "ViT-B-32", "checkpoint": missing}}})


def test_the_default_config_is_checked_without_importing_torch(repo):
    # the Snakefile runs the check on every start (and a SLURM job runs the Snakefile again): no 5-s torch import
    code = ("import sys; from pipeline.config import validate_config; from pipeline.inputs import check_inputs_exist; "
            "check_inputs_exist(validate_config({})); assert 'torch' not in sys.modules, 'torch imported'")
    res = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
