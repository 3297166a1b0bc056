"""Scaling of the SENSGEO covariance SDP (Sec. V) with the domain size m.

For a random public domain K of m points in [0,1]^d and one fixed query (Theorem 1), the
sensitivity hull has m(m-1) generators t_g(x, y). The antiparallel pair t_g(y, x) is implied
by t_g(x, y) (same direction, shorter), so m(m-1)/2 LMIs give the same optimum. This script
solves both formulations side by side with the same solver and prints, per m:

    m, d, LMIs (full / reduced), wall and solver-only seconds of each, the ratio full/reduced,
    the certified relative duality gap of each, and the relative difference of the optima.

Wall time includes cvxpy's compilation, which dominates for thousands of small LMIs. Run:

    python benchmarks/bench_sensgeo_sdp.py                     # m up to 60 (3540 LMIs), d = 2
    python benchmarks/bench_sensgeo_sdp.py --m 5 10 20 --d 3   # a quick look
    python benchmarks/bench_sensgeo_sdp.py --out results/tables/sensgeo_bench_sdp.parquet

``--out`` writes the reduced-formulation rows in the column layout of sensgeo_table_sdp.
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.methods.sensgeo.tables import sdp_row  # noqa: E402
from pipeline.privacy.sensgeo import geometry, sdp  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, nargs="+", default=[5, 10, 20, 30, 45, 60])
    ap.add_argument("--d", type=int, default=2)
    ap.add_argument("--solver", choices=sdp.SOLVERS, default="CLARABEL")
    ap.add_argument("--bandwidth", type=float, default=0.5)
    ap.add_argument("--rho", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the reduced rows as a sensgeo_table_sdp-style Parquet file")
    args = ap.parse_args(argv)

    header = (f"{'m':>4} {'d':>2} {'LMIs full':>9} {'reduced':>7} {'full wall_s':>11} {'red wall_s':>10} "
              f"{'ratio':>6} {'full solve_s':>12} {'red solve_s':>11} {'gap_rel full':>12} {'gap_rel red':>11} "
              f"{'|dv|/v':>8}")
    print(f"SENSGEO SDP scaling, solver {args.solver}, fixed query, bandwidth {args.bandwidth}, rho {args.rho}")
    print(header)
    rows = []
    for m in args.m:
        rng = np.random.default_rng([args.seed, m, args.d])
        domain = rng.uniform(size=(m, args.d))
        g = rng.uniform(size=args.d)
        w = np.eye(args.d)
        full = sdp.Instance(geometry.pair_generators(g, domain, args.bandwidth), w, args.rho)
        red = sdp.Instance(geometry.dominant_pair_generators(g, domain, args.bandwidth), w, args.rho)
        sol_full = sdp.solve_primal(full, solver=args.solver)
        cert_full = sdp.certify(full, sol_full)
        row = sdp_row(red, solver=args.solver, solve_dual=False)
        rows.append({"query": "fixed", "m": m, "d": args.d, "n_generators": m * (m - 1), "rho": args.rho,
                     "eta": 0.0, "weight": "identity", **row,
                     "full_wall_s": sol_full.wall_s, "full_solver_s": sol_full.solve_s, "full_gap_rel": cert_full.gap_rel})
        rel = abs(cert_full.primal_value - row["primal_value"]) / row["primal_value"]
        print(f"{m:>4} {args.d:>2} {full.J:>9} {red.J:>7} {sol_full.wall_s:>11.2f} {row['primal_wall_s']:>10.2f} "
              f"{sol_full.wall_s / row['primal_wall_s']:>6.2f} {sol_full.solve_s:>12.3f} {row['primal_solver_s']:>11.3f} "
              f"{cert_full.gap_rel:>12.1e} {row['gap_rel']:>11.1e} {rel:>8.1e}", flush=True)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident memory: {peak_mib:.0f} MiB")
    if args.out:
        from pipeline.reporting.tables import write_table

        write_table(pd.DataFrame(rows), args.out, config_id="bench_sensgeo_sdp", seed=args.seed)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
