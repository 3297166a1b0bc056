"""Stage dp_merf: one release, its ledger line within the target, a generator's balanced samples."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.baselines.dp_merf import dp_merf, median_length_scale, unit_pixels
from pipeline.io import Split, load_split, save_split
from pipeline.privacy import ledger
from pipeline.privacy.replay import audit
from pipeline.stage import PipelineError
from tests.conftest import one_thread

SMALL = {"delta": 1e-5, "n_samples": 12,
         "dp_merf": {"n_features": 32, "steps": 5, "batch_size": 12, "hidden": 8, "z_dim": 4}}


def write_splits(d):
    """30 private and 20 public random 8 x 8 images of 3 classes in folder ``d``."""
    rng = np.random.default_rng(0)
    save_split(d / "private.npz", Split(rng.integers(0, 256, (30, 1, 8, 8), dtype=np.uint8), np.arange(30) % 3),
               name="private_train", source="test", seed=0)
    save_split(d / "public.npz", Split(rng.integers(0, 256, (20, 1, 8, 8), dtype=np.uint8), np.arange(20) % 3),
               name="public", source="test", seed=0)
    return d


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    return write_splits(tmp_path_factory.mktemp("data"))


def run(splits, tmp, run="dp_merf_eps2_seed0", **section):
    out = {"samples": tmp / "s.npz", "ledger": tmp / "l.jsonl", "metrics": tmp / "m.json",
           "generator": tmp / "g.safetensors"}
    with one_thread():
        dp_merf({"data": splits / "private.npz", "public": splits / "public.npz"}, out,
                {"run": run, "baselines": {**SMALL, **section}, "device": "cpu", "config_id": "t",
                 "private": {"N": 30, "n_classes": 3}, "ledger_binding": {"run": "r", "experiment": "exp"}})
    return out


def test_a_run_writes_balanced_samples_and_one_certified_line_within_its_target(splits, tmp_path):
    out = run(splits, tmp_path)
    samples = load_split(out["samples"])
    assert samples.images.shape == (12, 1, 8, 8) and np.bincount(samples.labels).tolist() == [4, 4, 4]
    entry = ledger.only_line(out["ledger"], "dp_merf_embedding")
    assert entry.claimed_epsilon <= 2.0 and entry.extra["m"] == 30 and entry.sensitivity == pytest.approx(2 / 30)
    results, _ = audit({"l": out["ledger"]}, {"l": 1})
    assert results[0]["ok"] and results[0]["recomputed_epsilon"] <= 2.0
    metrics = json.loads(out["metrics"].read_text())
    assert metrics["noise_multiplier"] == pytest.approx(entry.noise_multiplier)


def test_the_generator_is_kept_as_safetensors_with_its_training_facts(splits, tmp_path):
    import torch

    from pipeline.baselines.dp_merf import generate, load_generator

    out = run(splits, tmp_path)
    G, meta = load_generator(out["generator"])
    entry = ledger.only_line(out["ledger"], "dp_merf_embedding")
    assert meta["private"] and meta["epsilon"] == entry.claimed_epsilon and meta["seed"] == 0
    assert meta["data_sha256"] == json.loads((splits / "private.json").read_text())["sha256"]
    s = generate(G, 6, generator=torch.Generator().manual_seed(1), device=torch.device("cpu"))
    assert s.images.shape == (6, 1, 8, 8) and s.images.dtype == np.uint8
    with pytest.raises(PipelineError, match="not a dpgen-dp-merf-generator/2 file"):
        from safetensors.torch import save_file

        save_file({"x": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
        load_generator(tmp_path / "other.safetensors")


def test_the_length_scale_is_the_median_public_distance(splits):
    import torch

    pub = unit_pixels(load_split(splits / "public.npz"))
    assert median_length_scale(pub, torch.Generator().manual_seed(0)) == pytest.approx(
        float(torch.pdist(pub).median()))


def test_another_methods_run_name_is_a_one_line_error(splits, tmp_path):
    with pytest.raises(PipelineError, match="is a pe run"):
        run(splits, tmp_path, run="pe_eps1_seed0")


def test_a_generator_file_is_the_same_bytes_whichever_process_writes_it_and_a_1_file_still_loads(tmp_path):
    """safetensors writes its metadata map in a per-process order: one key of sorted JSON keeps two runs' files (and
    their bundles' certificates) identical; a file of the /1 layout (three keys) still loads."""
    import subprocess
    import sys

    import torch
    from safetensors.torch import save_file

    from pipeline.baselines.dp_merf import Generator, load_generator

    script = ("import sys, torch; from pipeline.baselines.dp_merf import Generator, save_generator; "
              "torch.manual_seed(0); save_generator(sys.argv[1], Generator(4, 3, 8, (1, 4, 4)), "
              "{'run': 'x', 'seed': 0, 'epsilon': 1.0, 'private': True})")
    files = [tmp_path / f"g{i}.safetensors" for i in range(4)]
    for f in files:
        subprocess.run([sys.executable, "-c", script, str(f)], check=True, cwd=Path(__file__).parents[2])
    assert len({f.read_bytes() for f in files}) == 1
    G, meta = load_generator(files[0])
    assert meta == {"run": "x", "seed": 0, "epsilon": 1.0, "private": True}
    old = tmp_path / "old.safetensors"
    save_file({k: v.contiguous() for k, v in G.state_dict().items()}, str(old), metadata={
        "format": "dpgen-dp-merf-generator/1", "spec": json.dumps({"z_dim": 4, "n_classes": 3, "hidden": 8,
                                                                  "out_shape": [1, 4, 4]}),
        "meta": json.dumps(meta)})
    G1, meta1 = load_generator(old)
    assert meta1 == meta and all(torch.equal(a, b) for a, b in zip(G.state_dict().values(), G1.state_dict().values()))
