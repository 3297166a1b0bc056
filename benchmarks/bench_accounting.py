"""EMPDEN's (p, B) accounting grid: dp_accounting called the plain way vs our accountant.

Both sides compute, for every block of the 5 x 4 grid (p in {55,62,65,67,70}%, B in
{25,50,100,200}, n = 50,000, N_out = 50,000, delta = 1e-5, log-mass truncation -50), the
certified eps_u (pessimistic PLD) and the optimistic eps_l:

* naive: ``privacy_loss_distribution.from_gaussian_mechanism`` + ``self_compose`` +
  ``get_epsilon_for_delta`` for each block, one after the other in one process (what a script
  would do; ``--naive-workers 2`` runs two blocks at a time, only to finish sooner on a busy
  machine);
* ours: :func:`pipeline.privacy.accountants.pld_epsilon` -- the one-output PMF built by the
  vectorised code of :mod:`pipeline.privacy.fast_pld`, split onto a grid k h <= 1e-4 (k chosen
  per block; a dominating coarsening, provably never below the naive eps_u) and composed
  there, blocks over ``--workers`` processes.

Ours runs first; then the naive side, one row printed (and flushed) per block as it finishes,
then the total wall-time and CPU-time ratios naive/ours (on a machine shared with other jobs
the CPU seconds are the load-independent measure of work; wall time includes ours' use of two
processes) and, for eps_u and eps_l, the largest relative difference (ours - naive)/naive
with its sign and the smallest and largest signed ones (the goal for eps_u: never negative,
at most 1e-3). At the paper's h = 1e-5 the naive side took 851 CPU seconds for the 16 blocks
with p <= 67% (2026-11-30, shared 2-core machine), and its p = 70% blocks need more than 7 GiB
in one process: each naive block runs capped at ``--naive-mem-gib`` and is reported as a
MemoryError row if it does not fit (ratios are then over the blocks it finished). ``--h 1e-4``
is a quick look (the CLI's and DP-SGD calibration's grid; ours still splits onto k h, k <= 8). Run:

    python benchmarks/bench_accounting.py --h 1e-4               # quick look
    python benchmarks/bench_accounting.py                        # h = 1e-4 then the paper's 1e-5 (slow)
    python benchmarks/bench_accounting.py --p 55 62 --B 25 50    # a corner of the grid
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dp_accounting.pld import privacy_loss_distribution as pld_lib  # noqa: E402

from pipeline.privacy import accountants as acc  # noqa: E402
from pipeline.privacy import fast_pld  # noqa: E402
from pipeline.privacy.schedule import EDMSchedule, block_mu, k_private_steps, step_mu  # noqa: E402


def naive(mu: float, q: float, n_out: int, delta: float, h: float,
          mem_gib: float) -> tuple[float, float, float, float]:
    """eps_u, eps_l, wall seconds, CPU seconds of dp_accounting called the plain way.

    Runs in a fresh process capped at ``mem_gib`` of address space: the strongest blocks need
    more than a shared machine's 7 GiB at h = 1e-5, and a MemoryError (eps NaN) is reported
    as such instead of the whole benchmark being killed.
    """
    resource.setrlimit(resource.RLIMIT_AS, (int(mem_gib * 2**30), resource.RLIM_INFINITY))
    t, c = time.perf_counter(), time.process_time()
    out = []
    try:
        for pessimistic in (True, False):
            pld = pld_lib.from_gaussian_mechanism(1 / mu, sampling_prob=q, value_discretization_interval=h,
                                                  log_mass_truncation_bound=-50, pessimistic_estimate=pessimistic,
                                                  use_connect_dots=pessimistic)
            out.append(pld.self_compose(n_out).get_epsilon_for_delta(delta))
    except MemoryError:
        out = [math.nan, math.nan]
    return out[0], out[1], time.perf_counter() - t, time.process_time() - c


def ours(mu: float, q: float, n_out: int, delta: float, h: float) -> tuple[float, float, float, float, int]:
    """eps_u, eps_l, wall seconds, CPU seconds of our accountant, and the composition factor k."""
    t, c = time.perf_counter(), time.process_time()
    event, settings = acc.outputwise_event(mu, q, n_out), acc.PLDSettings(h, -50)
    upper = acc.pld_epsilon(event, delta, settings=settings)
    lower = acc.pld_epsilon(event, delta, pessimistic=False, settings=settings)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    composed = acc.build_pld(event, settings=settings)  # cached: the grid eps_u was composed on
    return upper, lower, wall, cpu, round(composed._pmf_remove._discretization / h)  # noqa: SLF001


def _relative(ours_value: float, naive_value: float) -> float:
    """(ours - naive) / naive; 0 when both are 0 (e.g. eps_l of a very weak block)."""
    if naive_value == 0:
        return 0.0 if ours_value == 0 else math.copysign(math.inf, ours_value)
    return (ours_value - naive_value) / naive_value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--p", type=float, nargs="+", default=[55, 62, 65, 67, 70])
    ap.add_argument("--B", type=int, nargs="+", default=[25, 50, 100, 200])
    ap.add_argument("--n", type=int, default=50000)
    ap.add_argument("--n-out", type=int, default=50000)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--h", type=float, nargs="+", default=[1e-4, 1e-5],
                    help="PLD discretisation(s), each run in turn (1e-4: the CLI's and DP-SGD calibration's; "
                         "1e-5: the paper's)")
    ap.add_argument("--workers", type=int, default=2, help="processes for ours")
    ap.add_argument("--naive-mem-gib", type=float, default=6.5,
                    help="address-space cap of each naive block's process (the shared machine kills > 7 GiB)")
    ap.add_argument("--naive-workers", type=int, default=1,
                    help="processes for the naive side (1 = what a script would do; more only to finish sooner "
                         "on a busy machine: compare CPU seconds then)")
    args = ap.parse_args(argv)
    verdicts = [(h, *run_grid(args, h)) for h in args.h]
    print("summary: " + "; ".join(f"h={h:g}: {v}" for h, v, _ in verdicts))
    return 0 if all(ok for _, _, ok in verdicts) else 1


def run_grid(args: argparse.Namespace, h: float) -> tuple[str, bool]:
    """Both sides on the grid at discretisation ``h``: rows, ratios; a one-line verdict and whether every
    eps_u of ours is at or above naive's (False also when the naive side finished no block)."""
    mu_t = step_mu(EDMSchedule(N=39), C=0.5, beta=1.0, batch_size=1)  # EMPDEN's released mu_bar_B
    grid = [(p, B, block_mu(mu_t, k_private_steps(39, p)), B / args.n) for p in args.p for B in args.B]
    jobs = [(mu, q, args.n_out, args.delta, h) for _, _, mu, q in grid]

    print(f"h={h:g} n={args.n} N_out={args.n_out} delta={args.delta:g}; processes: ours {args.workers}, "
          f"naive {args.naive_workers}; ours composes on k*h, k <= {fast_pld.composition_factor(h)} chosen "
          f"per block (column k)", flush=True)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        got = list(pool.map(ours, *zip(*jobs)))
    wall_ours = time.perf_counter() - t0
    cpu_ours = sum(g[3] for g in got)
    print(f"ours: {wall_ours:.1f} s wall, {cpu_ours:.1f} s CPU for {len(jobs)} blocks", flush=True)

    print(f"{'p':>4} {'B':>4} {'mu_bar':>7} {'eps_u naive':>12} {'eps_u ours':>12} {'rel_u':>9} {'eps_l naive':>12} "
          f"{'eps_l ours':>12} {'rel_l':>9} {'cpu naive':>9} {'cpu ours':>8} {'k':>3}", flush=True)
    rel_u, rel_l, cpu_naive, cpu_ours_done, failed = [], [], 0.0, 0.0, 0
    t0 = time.perf_counter()
    mem = [args.naive_mem_gib] * len(jobs)
    # a fresh process per block: the cap is per block and memory goes back to the OS
    with ProcessPoolExecutor(max_workers=args.naive_workers, max_tasks_per_child=1) as pool:
        for (p, B, mu, _), (un, ln, _, cn), (uo, lo, _, co, k) in zip(grid, pool.map(naive, *zip(*jobs), mem), got):
            if math.isnan(un):
                failed += 1
                print(f"{p:4g} {B:4d} {mu:7.4f} {'naive: MemoryError at ' + format(args.naive_mem_gib, 'g') + ' GiB':>38} "
                      f"{uo:12.6f} {'':9} {'':12} {lo:12.6f} {'':9} {cn:9.2f} {co:8.2f} {k:3d}", flush=True)
                continue
            cpu_naive += cn
            cpu_ours_done += co
            rel_u.append(_relative(uo, un))
            rel_l.append(_relative(lo, ln))
            print(f"{p:4g} {B:4d} {mu:7.4f} {un:12.6f} {uo:12.6f} {rel_u[-1]:9.2e} {ln:12.6f} {lo:12.6f} "
                  f"{rel_l[-1]:9.2e} {cn:9.2f} {co:8.2f} {k:3d}", flush=True)
    wall_naive = time.perf_counter() - t0
    peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    print(f"total wall: naive {wall_naive:.1f} s, ours {wall_ours:.1f} s, ratio naive/ours = "
          f"{wall_naive / wall_ours:.2f}x (same process counts as above; shared machine)")
    done = len(jobs) - failed
    if not done:
        print(f"naive side failed on every block (memory cap {args.naive_mem_gib:g} GiB); no ratio")
        return "no ratio (the naive side finished no block)", False
    print(f"total CPU over the {done} blocks naive finished: naive {cpu_naive:.1f} s, ours {cpu_ours_done:.1f} s, "
          f"ratio naive/ours = {cpu_naive / cpu_ours_done:.2f}x (load-independent); "
          f"peak RSS of one process {peak_gb:.2f} GiB")
    for name, rel in (("eps_u", rel_u), ("eps_l", rel_l)):
        largest = max(rel, key=abs)
        print(f"{name}: largest relative difference (ours - naive)/naive {largest:+.2e}, "
              f"smallest signed {min(rel):+.2e}, largest signed {max(rel):+.2e}")
    below = sum(r < 0 for r in rel_u)
    return (f"CPU ratio naive/ours {cpu_naive / cpu_ours_done:.1f}x over {done} blocks, eps_u below naive's "
            f"in {below} of {done}", below == 0)


if __name__ == "__main__":
    raise SystemExit(main())
