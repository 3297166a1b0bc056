"""The data-parallel DP-SGD step's diagnostic gather, alone: two gloo processes, pickled objects vs tensors.

A DP-SGD step asked for its diagnostics (STRAIGHTDP's App. D.3 quantiles) brings every rank's per-example gradient
norms and losses to every rank, in the single process's order. Arms, per call:

* ``objects``: the gather DPSGD used before #55's change, one ``all_gather_object`` of each rank's
  ``{micro-batch: (norms, losses)}`` (pickled, on the CPU), merged and concatenated;
* ``tensors``: :func:`pipeline.distributed.gather_ordered`, one ``all_gather`` of the per-micro-batch counts and one
  of the rows padded to the largest rank's (what a step asked for diagnostics runs now);
* ``none``: nothing (what a step not asked runs now: DPDM's, the classifier's).

Micro-batch j of ``--microbatch`` examples is on rank j mod 2, as in DPSGD. Prints the median and the 90th
percentile over ``--calls`` calls of the slower rank's wall time per call (barrier before each call), in
microseconds. Run:

    python benchmarks/bench_gather_norms.py                          # logical batches 256 and 4096
    python benchmarks/bench_gather_norms.py --batch 1024 --calls 500
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

ARMS = ("objects", "tensors", "none")


def gather_objects(rows: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: the pickled gather (pipeline.distributed.gather_ordered before the change), concatenated."""
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {k: (n.detach().cpu(), v.detach().cpu()) for k, (n, v) in rows.items()})
    merged = {k: v for g in gathered for k, v in (g or {}).items()}
    parts = [merged[k] for k in sorted(merged)]
    return torch.cat([n for n, _ in parts]), torch.cat([v for _, v in parts])


def gather_tensors(rows: dict[int, tuple[torch.Tensor, torch.Tensor]], n_parts: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    from pipeline import distributed

    both = distributed.gather_ordered({j: torch.stack([n, v], 1) for j, (n, v) in rows.items()}, n_parts=n_parts,
                                      width=2, dtype=torch.float32)
    return both[:, 0], both[:, 1]


def run_rank(rank: int, args, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    out = {}
    try:
        for batch in args.batch:
            g = torch.Generator().manual_seed(batch)
            norms, losses = torch.rand(batch, generator=g), torch.rand(batch, generator=g)
            n_parts = -(-batch // args.microbatch)
            rows = {j: (norms[j * args.microbatch:(j + 1) * args.microbatch],
                        losses[j * args.microbatch:(j + 1) * args.microbatch]) for j in range(rank, n_parts, 2)}
            a, b = gather_objects(rows), gather_tensors(rows, n_parts)  # warm-up, and the two agree
            assert all(torch.equal(x, y) and torch.equal(x, z) for x, y, z in zip(a, b, (norms, losses)))
            for arm in ARMS:
                times = []
                for _ in range(args.calls):
                    dist.barrier()
                    t = time.perf_counter()
                    if arm == "objects":
                        gather_objects(rows)
                    elif arm == "tensors":
                        gather_tensors(rows, n_parts)
                    times.append(time.perf_counter() - t)
                out[(batch, arm)] = times
    finally:
        dist.destroy_process_group()
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[256, 4096], help="logical batches (examples)")
    ap.add_argument("--microbatch", type=int, default=64, help="physical micro-batch (examples)")
    ap.add_argument("--calls", type=int, default=300, help="timed calls per arm")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(run_rank, args=(args, os.path.join(tmp, "init"), tmp), nprocs=2, start_method="spawn")
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in (0, 1)]
    print(f"2 gloo processes, 1 thread each, micro-batch {args.microbatch}, {args.calls} calls per arm; "
          "the slower rank's wall time per call, us")
    print(f"{'batch':>7}{'arm':>9}{'median':>9}{'p90':>9}")
    for batch in args.batch:
        for arm in ARMS:
            slower = [max(a, b) * 1e6 for a, b in zip(*(r[(batch, arm)] for r in ranks))]
            p90 = statistics.quantiles(slower, n=10)[-1]
            print(f"{batch:>7}{arm:>9}{statistics.median(slower):>9.0f}{p90:>9.0f}")


if __name__ == "__main__":
    main()
