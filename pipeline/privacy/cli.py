"""``python -m pipeline account``: what does this mechanism cost? JSON on stdout.

Examples::

    python -m pipeline account --mechanism subsampled-gaussian --mu 2.09 \\
        --sampling-prob 5e-4 --compositions 50000 --delta 1e-5
    python -m pipeline account --mechanism gaussian --mu 1.3 --delta 1e-5

Only ``eps_upper`` (pessimistic PLD) is a certified bound -- and ``eps_gdp`` for a plain
Gaussian, whose GDP composition is exact, and ``eps_rdp``, a looser certified bound.
``eps_lower`` (optimistic PLD), ``eps_edgeworth`` and ``eps_clt`` are estimates; the JSON
says so in ``"bounds"`` and ``"estimates"``. Errors are one line on stderr, exit status 2.

Any numeric input gets strict JSON or that one-line error, never a traceback: a quantity
that is not a finite number (eps_u when delta is below the mass the PLD truncates, the CLT
estimate when e^{mu^2} overflows, a PLD that would need more than :data:`MAX_PLD_POINTS` grid
points) is ``null`` with the reason under ``"notes"``; the GDP closed form still answers a
plain Gaussian of any mu (EMPDEN eq. 44 in log space).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from typing import Any

from pipeline.privacy import accountants as acc
from pipeline.privacy import fast_pld
from pipeline.privacy.edgeworth import Block, edgeworth_epsilon
from pipeline.privacy.mia import asr_bound


#: Largest PLD grid the command builds (~1.5 GB at peak, measured: mu = 30 needs 1.5e7 points
#: at h = 1e-4 and 1.3 GB). EMPDEN's strongest blocks need <= 3e6 at h = 1e-5; mu = 1e4
#: would need 1e12.
MAX_PLD_POINTS = 2 * 10**7
#: the finest grid the CLI accepts: a privacy loss l sits at index l / h, which overflows int64 for a denormal h
MIN_DISCRETISATION = 1e-10
#: Counts above 2^53 are not exact as doubles, which every accountant computes in.
MAX_COMPOSITIONS = 2**53
#: mu outside this range under/overflows mu^2 (GDP composition, e^{mu^2} of the CLT).
MU_RANGE = (1e-100, 1e100)
#: The Edgeworth quadrature spans [-40, mu + 40] in panels of 0.05 (3e5 nodes at this mu); the
#: estimate is long invalid there (App. D: one block's variance dominates, rho >> 1).
EDGEWORTH_MU_MAX = 1e3


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


def _finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _mu(args: argparse.Namespace) -> float:
    """The per-execution GDP parameter from ``--mu`` or ``--noise-multiplier``, range-checked."""
    lo, hi = MU_RANGE
    if args.mu is not None:
        if not lo <= args.mu <= hi:
            raise acc.AccountingError(f"--mu must be a number in [{lo:g}, {hi:g}], got {args.mu}")
        return args.mu
    if not 1 / hi <= args.noise_multiplier <= 1 / lo:
        raise acc.AccountingError(f"--noise-multiplier must be a number in [{1 / hi:g}, {1 / lo:g}], "
                                  f"got {args.noise_multiplier}")
    return 1.0 / args.noise_multiplier


def _pld_epsilon(event: Any, delta: float, pessimistic: bool, settings: acc.PLDSettings,
                 notes: dict[str, str], key: str) -> float | None:
    """eps from the PLD, or ``None`` with the reason in ``notes[key]`` (grid too large, eps infinite)."""
    try:
        with fast_pld.grid_limit(MAX_PLD_POINTS):
            eps = acc.pld_epsilon(event, delta, pessimistic=pessimistic, settings=settings)
    except fast_pld.GridTooLarge as exc:
        notes[key] = f"not computed: {exc}; use a coarser --discretisation"
        return None
    if not math.isfinite(eps):
        notes[key] = (f"infinite: delta {delta:g} is below the mass the PLD truncates or cannot bound "
                      f"(exp({settings.log_mass_truncation_bound:g}) plus the loss at infinity); "
                      "a more negative --log-mass-truncation lowers that mass")
        return None
    return eps


def account(args: argparse.Namespace) -> dict[str, Any]:
    mu = _mu(args)
    if not 0 < args.delta < 1:
        raise acc.AccountingError(f"--delta must be in (0, 1), got {args.delta}")
    if not 1 <= args.compositions <= MAX_COMPOSITIONS:
        raise acc.AccountingError(f"--compositions must be an integer in [1, 2^53], got {args.compositions}")
    if not args.discretisation >= MIN_DISCRETISATION:
        raise acc.AccountingError(f"--discretisation must be >= {MIN_DISCRETISATION:g} (a finer grid's loss indices "
                                  f"overflow), got {args.discretisation}")
    settings = acc.PLDSettings(args.discretisation, args.log_mass_truncation)
    notes: dict[str, str] = {}
    out: dict[str, Any] = {"mechanism": args.mechanism, "mu": mu, "compositions": args.compositions,
                           "delta": args.delta, "pld": acc.describe(settings)}
    if args.mechanism == "gaussian":
        if args.sampling_prob not in (None, 1.0):
            raise acc.AccountingError("--sampling-prob applies to --mechanism subsampled-gaussian only")
        event = acc.full_batch_event([mu], args.compositions)
        mu_total = acc.gdp_mu_of_event(event)
        out["mu_composed"] = mu_total
        out["eps_gdp"] = _finite(acc.gdp_epsilon(args.delta, mu_total))
        if out["eps_gdp"] is None:
            notes["eps_gdp"] = f"infinite: mu_composed^2 = {mu_total:g}^2 overflows a double"
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
        if mu <= EDGEWORTH_MU_MAX:
            ew = edgeworth_epsilon([Block(mu, q, args.compositions)], args.delta)
            out["eps_edgeworth"] = _finite(ew.eps)
            out["edgeworth_valid"] = ew.valid
            out["edgeworth_reason"] = ew.reason
        else:
            out["eps_edgeworth"], out["edgeworth_valid"] = None, False
            out["edgeworth_reason"] = f"not computed: its quadrature grid grows with mu (> {EDGEWORTH_MU_MAX:g})"
        out["eps_clt"] = _finite(acc.clt_epsilon([(mu, q, args.compositions)], args.delta))
        if out["eps_clt"] is None:
            notes["eps_clt"] = "infinite: the CLT's mu = sqrt(N q^2 (e^{mu^2} - 1)) overflows"
        out["bounds"] = ["eps_upper", "eps_rdp"]
        out["estimates"] = ["eps_lower", "eps_edgeworth", "eps_clt"]
    out["eps_upper"] = _pld_epsilon(event, args.delta, True, settings, notes, "eps_upper")
    out["eps_lower"] = None if args.no_lower else _pld_epsilon(event, args.delta, False, settings, notes,
                                                                "eps_lower")
    out["eps_rdp"] = _finite(acc.rdp_epsilon(event, args.delta))
    if out["eps_rdp"] is None:
        notes["eps_rdp"] = "infinite: no RDP order gives a finite bound at this delta"
    # from eps_upper; where the PLD was not built, from the tightest other certified bound
    source = "eps_upper" if out["eps_upper"] is not None else min(
        (k for k in out["bounds"] if out[k] is not None), key=out.__getitem__, default=None)
    out["asr_upper"] = asr_bound(math.inf if source is None else out[source], args.delta)
    out["asr_from"] = source
    if notes:
        out["notes"] = notes
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
        with warnings.catch_warnings():
            # overflow in an extreme regime shows up as a null with its note, not as stderr noise
            warnings.simplefilter("ignore", RuntimeWarning)
            result = account(args)
        # allow_nan=False: strict JSON; every non-finite number was turned into null + a note
        text = json.dumps(result, indent=2, allow_nan=False)
    except (acc.AccountingError, ValueError) as exc:
        print("error: " + " ".join(str(exc).split()), file=sys.stderr)  # one line, whatever the message
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
