"""Stage sample_dpdm: a denoiser file in, an evaluable labelled split (and a grid figure) out."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.cli import load_stage
from pipeline.io import load_split, manifest_path
from pipeline.models.checkpoint import save_denoiser
from pipeline.models.edm import EDMPrecond
from pipeline.models.unet import UNetSpec, build_unet
from pipeline.sampling.denoiser_stage import denoiser_image_shape, denoiser_num_classes
from pipeline.stage import PipelineError

SPEC = UNetSpec(image_size=8, channels=1, block_out_channels=(8, 16), attention=(False, False), num_classes=3)
SAMPLER = {"name": "edm", "steps": 4, "S_churn": 2.0, "guidance": 1.0}


@pytest.fixture(scope="module")
def denoiser_file(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("models") / "d.pt"
    save_denoiser(path, EDMPrecond(build_unet(SPEC)), unet=SPEC, precond="edm",
                  meta={"stage": "test", "privacy": {"epsilon": 1.0}})
    return path


def run(denoiser_file, out, **params):
    params = {"sampler": SAMPLER, "n_samples": 10, "seed": 0, "batch_size": 4, "device": "cpu", **params}
    load_stage("sample_dpdm")({"denoiser": denoiser_file}, {"samples": out / "s.npz", "figure": out / "s.png"},
                              params)
    return load_split(out / "s.npz")


def test_writes_a_balanced_uint8_split_of_the_denoisers_shape_with_a_figure(denoiser_file, tmp_path):
    split = run(denoiser_file, tmp_path)
    assert split.images.dtype == np.uint8 and split.images.shape == (10, 1, 8, 8)
    assert np.bincount(split.labels).tolist() == [4, 3, 3]
    manifest = json.loads(manifest_path(tmp_path / "s.npz").read_text())
    assert manifest["sampler"]["name"] == "edm" and manifest["denoiser_meta"]["privacy"] == {"epsilon": 1.0}
    assert (tmp_path / "s.png").is_file() and (tmp_path / "s.pdf").is_file()


def test_same_seed_same_images_other_seed_other_images(denoiser_file, tmp_path):
    a = run(denoiser_file, tmp_path / "a")
    b = run(denoiser_file, tmp_path / "b")
    c = run(denoiser_file, tmp_path / "c", seed=1)
    assert np.array_equal(a.images, b.images)
    assert not np.array_equal(a.images, c.images)


def test_bad_sampler_settings_are_one_line_errors(denoiser_file, tmp_path):
    with pytest.raises(PipelineError, match="unknown key 'step'"):
        run(denoiser_file, tmp_path, sampler={"step": 3})
    with pytest.raises(PipelineError, match="sampler name 'heun'"):
        run(denoiser_file, tmp_path, sampler={"name": "heun"})


def test_classes_and_shape_are_read_from_the_unet():
    model = EDMPrecond(build_unet(SPEC))
    assert denoiser_num_classes(model) == 3 and denoiser_image_shape(model) == (1, 8, 8)
    unconditional = UNetSpec(image_size=8, block_out_channels=(8, 16), attention=(False, False))
    assert denoiser_num_classes(EDMPrecond(build_unet(unconditional))) == 0


def test_sample_grid_stage_draws_one_panel_per_input(denoiser_file, tmp_path):
    run(denoiser_file, tmp_path)
    load_stage("dpdm_sample_grid")({"eps=1": tmp_path / "s.npz", "eps=10": tmp_path / "s.npz"},
                                   {"figure": tmp_path / "grid.png"}, {"per_class": 3, "title": "t"})
    assert (tmp_path / "grid.png").stat().st_size > 0
