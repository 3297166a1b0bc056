"""``python -m pipeline account``: what does this mechanism cost? JSON on stdout.

Examples::

    python -m pipeline account --mechanism subsampled-gaussian --mu 2.09 \\
        --sampling-prob 5e-4 --compositions 50000 --delta 1e-5
    python -m pipeline account --mechanism gaussian --mu 1.3 --delta 1e-5

Only ``eps_upper`` (pessimistic PLD) is a certified bound -- and ``eps_gdp`` for a plain
Gaussian, whose GDP composition is exact, and ``eps_rdp``, a looser certified bound.
``eps_lower`` (optimistic PLD), ``eps_edgeworth`` and ``eps_clt`` are estimates; the JSON
says so in ``"bounds"`` and ``"estimates"``. Errors are one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from pipeline.privacy import accountants as acc
from pipeline.privacy.edgeworth import Block, edgeworth_epsilon
from pipeline.privacy.mia import asr_bound


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage + message; we want one line
        raise acc.AccountingError(message)


def _parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="python -m pipeline account", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mechanism", required=True, choices=["gaussian", "subsampled-gaussian"],
                   help="gaussian: full batch (exact GDP); subsampled-gaussian: EMPDEN Prop. 4.1 block")
    noise = p.add_mutually_exclusive_group(required=True)
    noise.add_argument("--mu", type=float, help="GDP parameter of one execution (= sensitivity / noise std)")
    noise.add_argument("--noise-multiplier", type=float, help="noise std / sensitivity (= 1/mu)")
    p.add_argument("--sampling-prob", type=float, default=None, help="inclusion probability q in (0, 1]")
    p.add_argument("--compositions", type=int, default=1, help="number of independent executions (N_out)")
    p.add_argument("--delta", type=float, required=True, help="target delta in (0, 1)")
    p.add_argument("--discretisation", type=float, default=1e-4,
                   help="PLD grid width h (EMPDEN uses 1e-5: slower, tighter; default 1e-4)")
    p.add_argument("--log-mass-truncation", type=float, default=acc.PAPER_LOG_MASS_TRUNCATION,
                   help="ln of the tail mass the PLD may truncate (added to delta); default -50")
    p.add_argument("--no-lower", action="store_true", help="skip the optimistic PLD (halves the time)")
    return p


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def account(args: argparse.Namespace) -> dict[str, Any]:
    if args.mu is not None:
        if not (math.isfinite(args.mu) and args.mu > 0):
            raise acc.AccountingError(f"--mu must be a positive number, got {args.mu}")
        mu = args.mu
    else:
        if not (math.isfinite(args.noise_multiplier) and args.noise_multiplier > 0):
            raise acc.AccountingError(f"--noise-multiplier must be a positive number, got {args.noise_multiplier}")
        mu = 1.0 / args.noise_multiplier
    if not 0 < args.delta < 1:
        raise acc.AccountingError(f"--delta must be in (0, 1), got {args.delta}")
    if args.compositions < 1:
        raise acc.AccountingError(f"--compositions must be >= 1, got {args.compositions}")
    settings = acc.PLDSettings(args.discretisation, args.log_mass_truncation)
    out: dict[str, Any] = {"mechanism": args.mechanism, "mu": mu, "compositions": args.compositions,
                           "delta": args.delta, "pld": acc.describe(settings)}
    if args.mechanism == "gaussian":
        if args.sampling_prob not in (None, 1.0):
            raise acc.AccountingError("--sampling-prob applies to --mechanism subsampled-gaussian only")
        event = acc.full_batch_event([mu], args.compositions)
        mu_total = acc.gdp_mu_of_event(event)
        out["mu_composed"] = mu_total
        out["eps_gdp"] = acc.gdp_epsilon(args.delta, mu_total)
        out["bounds"] = ["eps_gdp", "eps_upper", "eps_rdp"]
        out["estimates"] = ["eps_lower"]
    else:
        q = args.sampling_prob
        if q is None:
            raise acc.AccountingError("--mechanism subsampled-gaussian needs --sampling-prob q in (0, 1]")
        if not 0 < q <= 1:
            raise acc.AccountingError(f"--sampling-prob must be in (0, 1], got {q}")
        event = acc.outputwise_event(mu, q, args.compositions)
        out["sampling_prob"] = q
        ew = edgeworth_epsilon([Block(mu, q, args.compositions)], args.delta)
        out["eps_edgeworth"] = _finite(ew.eps)
        out["edgeworth_valid"] = ew.valid
        out["edgeworth_reason"] = ew.reason
        out["eps_clt"] = _finite(acc.clt_epsilon([(mu, q, args.compositions)], args.delta))
        out["bounds"] = ["eps_upper", "eps_rdp"]
        out["estimates"] = ["eps_lower", "eps_edgeworth", "eps_clt"]
    out["eps_upper"] = acc.pld_epsilon(event, args.delta, settings=settings)
    out["eps_lower"] = None if args.no_lower else acc.pld_epsilon(event, args.delta, pessimistic=False,
                                                                   settings=settings)
    out["eps_rdp"] = _finite(acc.rdp_epsilon(event, args.delta))
    out["asr_upper"] = asr_bound(out["eps_upper"], args.delta)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
        result = account(args)
    except (acc.AccountingError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
