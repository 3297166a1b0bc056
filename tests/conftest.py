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


def planned_jobs(output: str) -> dict[str, int]:
    """rule -> job count from the 'Job stats' table of a dry run (empty when nothing is to be done)."""
    lines = output.splitlines()
    if "Job stats:" not in lines:
        return {}
    jobs = {}
    for line in lines[lines.index("Job stats:") + 3:]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        jobs[parts[0]] = int(parts[1])
    return jobs


#: the longest tests of the slow tier (the tiny end-to-end run is most of it), started first: the tier runs one
#: pytest-xdist worker per core (Makefile test-slow), and a long test picked up last would run alone while the
#: other core idles
LONGEST_FIRST = ("test_embedded_default_end_to_end_tiny",
                 "test_the_cifar10_public_unets_micro_batches_for_its_batch_of_512_stay_under_the_plan",
                 "test_a_toy_method_added_by_its_own_files_is_in_every_house_list",
                 "test_a_missing_data_source_stops_before_any_job_and_a_finished_data_stage_survives")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Collection order, but the :data:`LONGEST_FIRST` tests first (a stable sort: the rest keep theirs)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.name, len(rank)))


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
