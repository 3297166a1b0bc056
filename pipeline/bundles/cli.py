"""``python -m pipeline verify_bundle PATH`` and ``python -m pipeline sample_bundle PATH --n N --out x.npz``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from pipeline.stage import PipelineError


def _quiet() -> None:
    # the replay logs each failure it finds; a reader gets the one line this command prints instead
    logging.getLogger("pipeline").addHandler(logging.NullHandler())


def verify_main(argv: Sequence[str]) -> int:
    """Exit 0 and one line with the bundle's claim, or exit 1 and one line naming what failed."""
    from pipeline.bundles.bundle import verify

    parser = argparse.ArgumentParser(prog="python -m pipeline verify_bundle",
                                     description="Check a bundle: every file's sha256, the card against the "
                                                 "certificate, the transcripts replayed, the weights bound to them.")
    parser.add_argument("path", nargs="+", help="bundle folder(s) (results/bundles/<method>/<run>)")
    args = parser.parse_args(list(argv))
    _quiet()
    failed = 0
    for path in args.path:
        try:
            c = verify(path)
        except PipelineError as exc:
            print(f"FAILED {exc}", file=sys.stderr)
            failed += 1
            continue
        print(f"ok {path}: {c['method']}/{c['run']} ({c['epsilon']:.4g}, {c['delta']:.3g})-DP, {c['accountant']}, "
              f"{c['adjacency']}, {len(c['transcripts'])} transcript(s) replayed")
    return 1 if failed else 0


def sample_main(argv: Sequence[str]) -> int:
    """Sample a verified model bundle into a split file (``images``, ``labels`` + its manifest)."""
    from pipeline.bundles.sample import sample
    from pipeline.io import save_split

    parser = argparse.ArgumentParser(prog="python -m pipeline sample_bundle",
                                     description="Samples from a model bundle (verified first), offline.")
    parser.add_argument("path", help="bundle folder")
    parser.add_argument("--n", type=int, required=True, help="number of samples (labels balanced over the classes)")
    parser.add_argument("--out", required=True, help="output .npz (its manifest .json is written beside it)")
    parser.add_argument("--seed", type=int, default=None, help="generation seed (default: the run's own)")
    parser.add_argument("--batch-size", type=int, default=None, help="images at once (default: the run's own; "
                        "with the seed it fixes the output)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda[:N] | auto (default cpu)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the run's own)")
    args = parser.parse_args(list(argv))
    if not args.out.endswith(".npz"):
        parser.error(f"--out {args.out}: expected a path ending in .npz")
    _quiet()
    try:
        split = sample(args.path, args.n, seed=args.seed, batch_size=args.batch_size, device=args.device,
                       threads=args.threads)
        save_split(args.out, split, name=str(args.path), source="sample_bundle",
                   seed=-1 if args.seed is None else args.seed)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.out}: {len(split.labels)} samples from {args.path}")
    return 0
