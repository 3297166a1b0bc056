"""Ledger transcripts as the workflow binds and registers them, for tests that run the replay stage.

A stage stamps every line with its ``ledger_binding`` (run, experiment) and the sha256 of the private
split it read; the method registers the transcript (pipeline.registry.TranscriptSpec) and the rule
``replay`` passes those registrations. These helpers do the same for lines a test wrote directly.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.privacy import ledger
from pipeline.privacy.replay import replay

EXPERIMENT = "exp"
#: the sha256 the tests' private split manifest records (what every mechanism line is bound to)
SPLIT_SHA = "5" * 64
#: the stage that writes configuration claims (they read no private data)
CONFIGURATION_STAGE = "empden_blocks"


def bind(path: Path, run: str, data_sha256: str = SPLIT_SHA, experiment: str = EXPERIMENT) -> Path:
    """Rewrite ``path``'s lines bound to ``run`` (as a stage's ``ledger_binding`` and split do): seq 0, 1, ..."""
    entries = [e for _, e in ledger.read_ledger(path)]
    path.unlink()
    for entry in entries:
        ledger.append_entry(path, entry, ledger.Binding(run=run, experiment=experiment, data_sha256=data_sha256))
    return path


def split_file(tmp_path: Path, sha256: str = SPLIT_SHA, n: int = 2500) -> Path:
    """A private split's path whose manifest records ``sha256`` and its size ``n`` (the replay reads the manifest
    only)."""
    path = tmp_path / "data" / "private_train.npz"
    path.parent.mkdir(exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps({"sha256": sha256, "n": n}))
    return path


def declared_size(*paths: Path, default: int = 2500) -> int:
    """The size N the first line of ``paths`` that declares one says it read (``default`` if none does): the size a
    test's split manifest records, so genuine lines of any N replay."""
    from pipeline.privacy import rebuild

    for path in paths:
        try:
            entries = [e for _, e in ledger.read_ledger(path)]
        except (FileNotFoundError, ledger.LedgerError):
            continue
        for e in entries:
            if e.stage == CONFIGURATION_STAGE:
                continue  # configuration claims read no split
            field = rebuild.size_field(e.mechanism)
            value = rebuild.lookup(e, field) if field else rebuild.MISSING
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return default


def registration(path: Path, data: Path, **overrides) -> dict:
    """The registry's TranscriptSpec of a transcript as its first line says it was written (run, stage, delta), its
    claims the lines it holds: what the workflow's rule replay passes (``overrides`` replace any of it)."""
    try:
        entries = [e for _, e in ledger.read_ledger(path)]
    except (FileNotFoundError, ledger.LedgerError):
        entries = []
    first = entries[0] if entries else None
    configuration = first is not None and first.stage == CONFIGURATION_STAGE
    claims = overrides.get("claims", max(1, len(entries)))
    # the lines' own composition counts, one per registered claim (a claim the transcript lacks: its first line's)
    counts = [e.count for e in entries][:claims] if isinstance(claims, int) else []
    counts += [first.count if first else 1] * ((claims if isinstance(claims, int) else 0) - len(counts))
    spec = {"claims": claims, "run": first.run if first else "r", "stage": first.stage if first else "s",
            "delta": first.delta if first else 1e-5, "data": None if configuration else str(data),
            "configuration": configuration, "params": [{"count": c} for c in counts] or [{"count": 1}],
            "epsilon_target": [None] * max(1, len(counts)), "after": [], "rtol": 1e-3,
            "phase": first.phase if first else "", "prior_lines": [[]] * max(1, len(counts))}
    return {**spec, **overrides}


def replay_stage(tmp_path: Path, data: Path | None = None, expected: dict | None = None, **transcripts: Path) -> dict:
    """The replay stage on ``transcripts``, each registered as :func:`registration` says unless ``expected`` does;
    the report it wrote."""
    out = tmp_path / "replay.json"
    data = data or split_file(tmp_path, n=declared_size(*transcripts.values()))
    if expected is None:
        expected = {name: registration(path, data) for name, path in transcripts.items()}
    replay(transcripts, {"report": out}, {"config_id": "c", "experiment": EXPERIMENT, "expected": expected})
    return json.loads(out.read_text())
