"""One clipped-empirical-denoiser step (EMPDEN eq. 38) against a plain matmul of the same shape.

A full-batch step on n_out states of dimension d over n records costs two matmuls of shape
[n_out, d] x [d, n] -- the squared distances ||x_t||^2 - 2 x_t . x0 + ||x0||^2 and the weighted
sum of the records -- plus O(n_out n) elementwise work (log kernel, clip, max shift, exp). So its
FLOP count is taken as 2 * (2 n_out n d), and the figure of merit is

    ratio = (4 n_out n d / time of one step) / (2 n_out n d / time of one plain matmul),

the step's FLOP rate as a fraction of the plain matmul's, both measured in the same run, same
dtype, same device, interleaved (median over repeats). Goal (issue 4): >= 0.6. Also timed: the
subsampled variant (both ways: mask all n records, or gather each output's B) and the whole private step (with noise).

    python benchmarks/bench_empirical_denoiser.py                      # n=3000, d=256, n_out=256
    python benchmarks/bench_empirical_denoiser.py --n 50000 --d 3072 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from pipeline.privacy import empirical_denoiser as emp  # noqa: E402

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def bench(n: int, d: int, n_out: int, B: int, dtype: torch.dtype, device: torch.device, repeats: int,
          t: float) -> dict[str, float]:
    gen = torch.Generator(device=device).manual_seed(0)
    data = emp.prepare_records(torch.rand(n, d, generator=gen, device=device) * 2 - 1, dtype=dtype, device=device)
    x_t = (data.x0[:n_out] + t * torch.randn(n_out, d, generator=gen, device=device, dtype=dtype)).contiguous()
    other = torch.randn(d, n, generator=gen, device=device, dtype=dtype)
    subset = emp.draw_subsets(n, B, n_out, generator=gen, device=device)
    cases = {
        "matmul": lambda: x_t @ other,
        "step_full": lambda: emp.clipped_empirical_denoiser(x_t, data, t, C=1.0, beta=1.0),
        "step_sub_mask": lambda: emp.clipped_empirical_denoiser(x_t, data, t, C=1.0, beta=1.0, subset=subset,
                                                                method="mask"),
        "step_sub_gather": lambda: emp.clipped_empirical_denoiser(x_t, data, t, C=1.0, beta=1.0, subset=subset,
                                                                  method="gather"),
        "private_step_full": lambda: emp.private_step(x_t, data, t, t * 0.9, C=1.0, beta=1.0, generator=gen),
    }
    for fn in cases.values():  # warm-up (allocator, BLAS threads, CUDA kernels)
        fn()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeats):  # interleaved, so a busy machine slows every case alike
        for name, fn in cases.items():
            times[name].append(timed(fn, device))
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000, help="records in the private set")
    ap.add_argument("--d", type=int, default=256, help="dimension of one record")
    ap.add_argument("--n-out", type=int, default=256, help="outputs denoised together")
    ap.add_argument("--B", type=int, default=100, help="subsample size of the subsampled variant")
    ap.add_argument("--t", type=float, default=0.5, help="noise level of the step")
    ap.add_argument("--dtype", choices=sorted(DTYPES), nargs="+", default=["float64", "float32"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    flops_mm = 2.0 * args.n_out * args.n * args.d
    print(f"device={device} threads={torch.get_num_threads()} n={args.n} d={args.d} n_out={args.n_out} "
          f"B={args.B} t={args.t} repeats={args.repeats} (median seconds)")
    print(f"{'dtype':8s} {'matmul':>10s} {'step':>10s} {'sub.mask':>10s} {'sub.gathr':>10s} {'priv.step':>10s} "
          f"{'GFLOP/s mm':>11s} {'GFLOP/s step':>13s} {'ratio':>6s}")
    for name in args.dtype:
        r = bench(args.n, args.d, args.n_out, args.B, DTYPES[name], device, args.repeats, args.t)
        rate_mm, rate_step = flops_mm / r["matmul"], 2 * flops_mm / r["step_full"]
        print(f"{name:8s} {r['matmul']:10.5f} {r['step_full']:10.5f} {r['step_sub_mask']:10.5f} "
              f"{r['step_sub_gather']:10.5f} "
              f"{r['private_step_full']:10.5f} {rate_mm / 1e9:11.2f} {rate_step / 1e9:13.2f} "
              f"{rate_step / rate_mm:6.2f}")
    print("ratio = step FLOP rate (2 matmuls' FLOPs) / plain matmul FLOP rate; goal >= 0.6")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
