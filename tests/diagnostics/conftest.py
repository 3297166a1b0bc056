"""Tiny inputs of the diagnostics stages: a private split, a randomly initialised public EDM
denoiser file (the pretraining stage's format) and an untrained evaluation net, all 8x8 grey."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.evaluation.evalnet import EvalNet, save_evalnet
from pipeline.io import Split, save_split
from pipeline.models.checkpoint import save_denoiser
from pipeline.models.edm import EDMPrecond
from pipeline.models.unet import UNetSpec, build_unet
from tests.conftest import one_thread

SHAPE = (1, 8, 8)
SPEC = UNetSpec(image_size=8, channels=1, block_out_channels=(8, 8), attention=(False, False), norm_num_groups=4)


@pytest.fixture(scope="package", autouse=True)
def _one_thread():
    """Tiny models run fastest on one thread on a shared machine (as the stages do via ``threads``)."""
    with one_thread():
        yield


@pytest.fixture(scope="package")
def files(tmp_path_factory):
    """Paths of a private split, a public denoiser file, an evaluation net file and a public split."""
    root = tmp_path_factory.mktemp("diag")
    rng = np.random.default_rng(0)
    private = root / "private_train.npz"
    save_split(private, Split(rng.integers(0, 256, size=(30, *SHAPE), dtype=np.uint8), rng.integers(0, 10, 30)),
               name="private_train", source="test", seed=0)
    public = root / "public.npz"
    save_split(public, Split(rng.integers(0, 256, size=(40, *SHAPE), dtype=np.uint8), rng.integers(0, 10, 40)),
               name="public", source="test", seed=0)
    torch.manual_seed(0)
    save_denoiser(root / "public_edm.pt", EDMPrecond(build_unet(SPEC)), unet=SPEC, precond="edm")
    torch.manual_seed(0)
    save_evalnet(EvalNet(SHAPE, 10, width=4, feature_dim=8), root / "evalnet.pt")
    return {"private": private, "denoiser": root / "public_edm.pt", "evalnet": root / "evalnet.pt",
            "public_data": public}
