"""The config's device string: auto falls back to the CPU, an absent GPU is one line."""

from __future__ import annotations

import pytest
import torch

from pipeline.device import resolve_device
from pipeline.stage import PipelineError


def test_auto_picks_cuda_only_when_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


def test_cpu_is_always_available():
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_is_one_line(monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(PipelineError, match=f"device '{name}': CUDA is not available") as err:
        resolve_device(name)
    assert "\n" not in str(err.value)


def test_cuda_index_beyond_the_visible_gpus_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(PipelineError, match="only 1 CUDA device"):
        resolve_device("cuda:1")


def test_unknown_device_names_are_rejected():
    with pytest.raises(PipelineError, match="expected auto, cpu, cuda or cuda:N"):
        resolve_device("tpu")
