"""Shared fixtures. Tests never touch the network: hub look-ups are forced offline."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # make test runs one pytest-xdist worker per core: each keeps torch and BLAS to its own core
    # (set before anything imports torch, or two workers x two threads fight over two cores)
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch and BLAS/OpenMP on one thread: tiny models run fastest so on a shared 2-core machine
    (the stages do the same through their ``threads`` param)."""
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(before)
