"""``train_straightdp`` as two gloo data-parallel processes (issue #55): every rank plans from rank 0's distilled
weights and runs rank 0's THA plan, and a rank whose own plan differs from rank 0's stops every rank, in one line,
before any private step.

On CUDA, nondeterministic kernels can move a rank's distilled weights and the arg max of its public proxy; CPU
processes are deterministic, so here rank 1 is made to differ on purpose: its distillation lands elsewhere, or its
proxy ranks the shapes the other way round. The stage itself runs in each process, joined by its own
``pipeline.distributed.data_parallel`` from torchrun's environment variables, on the tiny world of
``tests/methods/straightdp/test_stages.py``.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.methods.straightdp import stages as sdp
from pipeline.stage import PipelineError
from pipeline.training import loop
from tests.methods.straightdp.test_stages import BINDING, PRIVATE, TINY, make_world, release

RUN = "tha_moments_eps1_seed0"
#: several micro-batches per logical batch, so both ranks have a share of the clipped sum
CFG = {**TINY, "dpsgd": {**TINY["dpsgd"], "micro_batch": 8}}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """The stage's inputs for RUN: private and public data, public geometry, a public flow and its release."""
    root = tmp_path_factory.mktemp("straightdp_dp")
    paths = make_world(root, CFG)
    rel = release(paths, root, RUN)
    return {**paths, "moments": rel["moments"], "release_ledger": rel["ledger"]}


def digest(model: torch.nn.Module) -> str:
    return hashlib.sha256(b"".join(t.detach().cpu().numpy().tobytes() for t in model.state_dict().values())
                          ).hexdigest()


def _instrument(rank: int, case: str, record: dict[str, Any]) -> None:
    """Record, in this process, what the stage plans from, chooses and runs; make rank 1 differ as ``case`` says."""
    real_plan, real_grads = sdp.stage2_plan, sdp.public_bucket_gradients
    real_train, real_distill = sdp.dpsgd_flow_training, sdp.distill_to_field

    def stage2_plan(*args: Any, **kwargs: Any) -> Any:
        plan, scores = real_plan(*args, **kwargs)
        record["own_plan"] = {"clips": list(plan.clips), "beta": plan.beta}
        return plan, scores

    def public_bucket_gradients(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        record.setdefault("planned_from", digest(model))
        return real_grads(model, *args, **kwargs)

    def dpsgd_flow_training(model: torch.nn.Module, plan: Any, *args: Any, **kwargs: Any) -> Any:
        record["dpsgd_entered"] = True
        record["ran_plan"] = {"clips": list(plan.clips), "beta": plan.beta, "noise_std": plan.noise_std}
        return real_train(model, plan, *args, **kwargs)

    sdp.stage2_plan, sdp.public_bucket_gradients, sdp.dpsgd_flow_training = (
        stage2_plan, public_bucket_gradients, dpsgd_flow_training)
    if rank == 1 and case == "distillation":
        def distill_to_field(*args: Any, **kwargs: Any) -> Any:
            res = real_distill(*args, **kwargs)
            with torch.no_grad():
                for p in res.ema.parameters():
                    p.add_(0.01)
            record["own_distilled"] = digest(res.ema)
            return res

        sdp.distill_to_field = distill_to_field
    if rank == 1 and case == "proxy":
        real_proxy = sdp.tha.gradient_snr_proxy
        sdp.tha.gradient_snr_proxy = lambda grads, plan: -real_proxy(grads, plan)


def _rank(rank: int, size: int, port: int, inputs: dict[str, Path], outputs: dict[str, Path],
          params: dict[str, Any], case: str, record_dir: str) -> None:
    import torch.distributed as dist

    # what torchrun sets; the stage joins the group itself (pipeline.distributed.data_parallel)
    os.environ.update(WORLD_SIZE=str(size), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    # a rank left waiting for one that stopped fails after 2 minutes instead of hanging the test
    dist.init_process_group = functools.partial(dist.init_process_group, timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    record: dict[str, Any] = {"dpsgd_entered": False}
    _instrument(rank, case, record)
    try:
        sdp.train_straightdp(inputs, outputs, params)
    except PipelineError as exc:
        record["error"] = str(exc)
    Path(record_dir, f"rank{rank}.json").write_text(json.dumps(record))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def two_ranks(inputs: dict[str, Path], tmp: Path, case: str) -> tuple[dict[str, Path], list[dict[str, Any]]]:
    """The stage as two gloo processes under ``case``: its outputs and each rank's record."""
    import torch.multiprocessing as mp

    outputs = {"model": tmp / "m.pt", "ledger": tmp / "train.jsonl", "metrics": tmp / "metrics.json"}
    params = {"straightdp": CFG, "run": RUN, "device": "cpu", "private": PRIVATE, "ledger_binding": BINDING,
              "checkpoint_dir": str(tmp / "ck")}
    ctx = mp.start_processes(_rank, args=(2, free_port(), inputs, outputs, params, case, str(tmp)), nprocs=2,
                             start_method="spawn", join=False)
    deadline = time.monotonic() + 300
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"two ranks of train_straightdp ({case}) still running after 300 s")
    return outputs, [json.loads((tmp / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_every_rank_plans_from_and_runs_rank_0s_distilled_flow(inputs, tmp_path):
    """Rank 1's own distillation differs from rank 0's: both ranks' planner reads rank 0's weights, both choose
    the same plan, both run it, and rank 0 writes the outputs."""
    outputs, (rank0, rank1) = two_ranks(inputs, tmp_path, "distillation")
    assert "error" not in rank0 and "error" not in rank1, (rank0, rank1)
    assert rank1["own_distilled"] != rank0["planned_from"], "rank 1 distilled other weights"
    assert rank1["planned_from"] == rank0["planned_from"]
    assert rank0["own_plan"] == rank1["own_plan"]
    assert rank0["dpsgd_entered"] and rank1["dpsgd_entered"] and rank0["ran_plan"] == rank1["ran_plan"]
    assert all(p.exists() for p in outputs.values())


def test_a_rank_that_chose_another_plan_stops_every_rank_before_any_private_step(inputs, tmp_path):
    """Rank 1's proxy prefers the other shape (as a nondeterministic kernel could make it): every rank stops with
    one line naming rank 1, the first field that differs and both values; no rank entered DP-SGD, nothing private
    was written."""
    outputs, (rank0, rank1) = two_ranks(inputs, tmp_path, "proxy")
    assert rank0["own_plan"]["beta"] != rank1["own_plan"]["beta"], "the test's premise: rank 1 chose otherwise"
    assert rank0.get("error") == rank1.get("error")
    error = rank0["error"]
    assert "\n" not in error
    first = (f"rank 1's clips = {json.dumps(rank1['own_plan']['clips'])} differs from rank 0's clips = "
             f"{json.dumps(rank0['own_plan']['clips'])}")
    assert error.startswith(f"stage train_straightdp {RUN}: the Stage-2 plan: {first} (also differ: "), error
    assert re.search(r"\(also differ: [^)]*\bbeta\b", error), error
    assert not rank0["dpsgd_entered"] and not rank1["dpsgd_entered"]
    assert not any(p.exists() for p in outputs.values())
    assert not (tmp_path / "ck" / loop.STATE_FILE).exists()  # the DP-SGD state (the distillation's is under distill/)
