"""EMPDEN's (p, B) accounting grid: dp_accounting called the plain way vs our accountant.

Both sides compute, for every block of the 5 x 4 grid (p in {55,62,65,67,70}%, B in
{25,50,100,200}, n = 50,000, N_out = 50,000, delta = 1e-5, log-mass truncation -50), the
certified eps_u (pessimistic PLD) and the optimistic eps_l:

* naive: ``privacy_loss_distribution.from_gaussian_mechanism`` + ``self_compose`` +
  ``get_epsilon_for_delta`` for each block, one after the other (what a script would do);
* ours: :func:`pipeline.privacy.accountants.pld_epsilon` -- the same algorithm run by the
  vectorised code of :mod:`pipeline.privacy.fast_pld` (build, compose, eps scan), blocks over
  ``--workers`` processes.

Prints per-block times and eps, the total time ratio naive/ours, the largest relative
difference of eps_u and the smallest signed difference (ours - naive; never negative is the
goal). At the paper's h = 1e-5 the naive side takes of the order of an hour and several GB
for the strongest blocks; ``--h 1e-4`` is a quick look. Run:

    python benchmarks/bench_accounting.py --h 1e-4               # quick look
    python benchmarks/bench_accounting.py                        # paper settings (slow)
    python benchmarks/bench_accounting.py --p 55 62 --B 25 50    # a corner of the grid
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dp_accounting.pld import privacy_loss_distribution as pld_lib  # noqa: E402

from pipeline.privacy import accountants as acc  # noqa: E402
from pipeline.privacy.schedule import EDMSchedule, block_mu, private_steps, step_mu  # noqa: E402


def naive(mu: float, q: float, n_out: int, delta: float, h: float) -> tuple[float, float, float]:
    t = time.perf_counter()
    out = []
    for pessimistic in (True, False):
        pld = pld_lib.from_gaussian_mechanism(1 / mu, sampling_prob=q, value_discretization_interval=h,
                                              log_mass_truncation_bound=-50, pessimistic_estimate=pessimistic,
                                              use_connect_dots=pessimistic)
        out.append(pld.self_compose(n_out).get_epsilon_for_delta(delta))
    return out[0], out[1], time.perf_counter() - t


def ours(mu: float, q: float, n_out: int, delta: float, h: float) -> tuple[float, float, float]:
    t = time.perf_counter()
    event, settings = acc.outputwise_event(mu, q, n_out), acc.PLDSettings(h, -50)
    upper = acc.pld_epsilon(event, delta, settings=settings)
    lower = acc.pld_epsilon(event, delta, pessimistic=False, settings=settings)
    return upper, lower, time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--p", type=float, nargs="+", default=[55, 62, 65, 67, 70])
    ap.add_argument("--B", type=int, nargs="+", default=[25, 50, 100, 200])
    ap.add_argument("--n", type=int, default=50000)
    ap.add_argument("--n-out", type=int, default=50000)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--h", type=float, default=1e-5)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    mu_t = step_mu(EDMSchedule(N=39), C=0.5, beta=1.0, batch_size=1)  # EMPDEN's released mu_bar_B
    grid = [(p, B, block_mu(mu_t, private_steps(39, p)), B / args.n) for p in args.p for B in args.B]
    jobs = [(mu, q, args.n_out, args.delta, args.h) for _, _, mu, q in grid]

    t0 = time.perf_counter()
    ref = [naive(*j) for j in jobs]
    t_naive = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        got = list(pool.map(ours, *zip(*jobs)))
    t_ours = time.perf_counter() - t0

    print(f"h={args.h:g} n={args.n} N_out={args.n_out} delta={args.delta:g} workers={args.workers}")
    print(f"{'p':>4} {'B':>4} {'mu_bar':>7} {'eps_u naive':>12} {'eps_u ours':>12} {'eps_l naive':>12} "
          f"{'eps_l ours':>12} {'s naive':>8} {'s ours':>8}")
    rel, signed = 0.0, math.inf
    for (p, B, mu, _), (un, ln, tn), (uo, lo, to) in zip(grid, ref, got):
        print(f"{p:4g} {B:4d} {mu:7.4f} {un:12.6f} {uo:12.6f} {ln:12.6f} {lo:12.6f} {tn:8.2f} {to:8.2f}")
        rel = max(rel, abs(uo - un) / un)
        signed = min(signed, (uo - un) / un)
    print(f"total: naive {t_naive:.1f} s, ours {t_ours:.1f} s, ratio naive/ours = {t_naive / t_ours:.2f}x")
    print(f"eps_u: largest relative difference {rel:.2e}, smallest signed (ours - naive)/naive {signed:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
