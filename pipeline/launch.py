"""How a ``--nproc N`` stage becomes N torchrun processes: the command line, the world size torchrun set, each
rank's log path.

Torch-free on purpose: :mod:`pipeline.cli` imports this for every ``python -m pipeline`` call, and most stages
(tables, figures, the report, the replay) never import torch; importing it here cost every such job ~4 s of
start-up (measured: ``import pipeline.cli`` 0.34 s without, 4.2 s with). What the processes do once started is
:mod:`pipeline.distributed`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from pipeline.stage import PipelineError


def launched_size() -> int:
    """``WORLD_SIZE`` as torchrun set it (1 outside torchrun)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise PipelineError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r}: expected an integer") from None


def launch_argv(nproc: int, argv: Sequence[str]) -> list[str]:
    """The command that runs ``python -m pipeline *argv`` as ``nproc`` data-parallel processes on this node.

    ``--standalone`` gives each job its own rendezvous on a free local port, so several such jobs can
    share a node. One node: the processes are this job's (SLURM: one task with N GPUs).
    """
    if not (isinstance(nproc, int) and nproc >= 1):
        raise PipelineError(f"--nproc: expected an integer >= 1, got {nproc!r}")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "pipeline", *argv]


def rank_log_path(path: os.PathLike[str] | str) -> str:
    """Where rank r > 0 of a torchrun-launched stage writes its log: beside rank 0's, ``.rank<r>`` added."""
    rank = int(os.environ.get("RANK", "0"))
    return str(path) if rank == 0 else f"{path}.rank{rank}"
