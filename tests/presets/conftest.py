"""The preset tier runs only when asked for: ``pytest -m presets`` or DPGEN_PRESETS=1.

Each test runs one paper preset (configs/*.yaml) end to end through Snakemake at a tiny
size, a few minutes of 2 CPU cores apiece, so plain ``pytest`` (``make test``) skips them at
collection time and ``.ci/run`` runs them as a step of its own.
"""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest

ENABLE = "DPGEN_PRESETS"
HOW = f"pytest -m presets tests/presets (or {ENABLE}=1)"


def _selected(config: pytest.Config) -> bool:
    """True when the tier was asked for, by environment or by a -m expression naming it."""
    return os.environ.get(ENABLE) == "1" or "presets" in (config.getoption("markexpr") or "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _selected(config):
        return
    skip = pytest.mark.skip(reason=f"preset tier (minutes per preset); run: {HOW}")
    for item in items:
        if item.get_closest_marker("presets") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def inception_standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stand-in for torch-fidelity's ``inception-v3-compat`` weights file.

    The real file is a download (torch-fidelity's release page) that tests never make. This is
    torch-fidelity's own ``FeatureExtractorInceptionV3`` with random weights, its batch-norm
    statistics set from one batch of noise images so that features keep unit scale through the
    network (random convolutions with the default statistics shrink them ~6x per layer). It
    loads exactly where the real file would; the features mean nothing.
    """
    import torch
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    torch.manual_seed(0)
    # the constructor loads weights from a path: hand it an empty load and keep the random init
    with mock.patch.object(torch, "load", return_value={}), \
            mock.patch.object(FeatureExtractorInceptionV3, "load_state_dict"):
        net = FeatureExtractorInceptionV3("inception-v3-compat", ["2048"], feature_extractor_weights_path="-")
    for module in net.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.momentum = None  # running statistics = the calibration batch's
            module.reset_running_stats()
    net.train()
    with torch.no_grad():
        net(torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)))
    path = tmp_path_factory.mktemp("inception") / "weights-inception-standin.pth"
    torch.save(net.state_dict(), path)
    return path
