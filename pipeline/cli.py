"""Thin command line over the stages: ``python -m pipeline STAGE --in/--out/--params``.

Every DAG stage is reachable from here (that is all a Snakemake rule runs) and from tests
by calling the stage object directly. ``python -m pipeline --help`` lists them;
``python -m pipeline STAGE --help`` prints the stage's inputs, outputs and params.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from pipeline import launch
from pipeline.config import ConfigError
from pipeline.plugins import data_parallel_stages, merge_stages, method_stages
from pipeline.stage import PipelineError, StageSpec

#: stages every method shares: data, the evaluation core, public pretraining, reporting and the
#: ledger replay (stage name -> "module:attribute"; imported lazily so ``--help`` stays fast)
CORE_STAGES: dict[str, str] = {
    "prepare_data": "pipeline.data.stage:prepare_data",
    "train_evalnet": "pipeline.evaluation.evalnet:train_evalnet",
    "evaluate_samples": "pipeline.evaluation.stage:evaluate_samples",
    "extract_features": "pipeline.evaluation.stage:extract_features_stage",
    "train_clip": "pipeline.evaluation.clip:train_clip",
    "import_clip": "pipeline.evaluation.clip:import_clip",
    "data_figure": "pipeline.reporting.stage:data_figure",
    "collect_table": "pipeline.reporting.stage:collect_table",
    "index_html": "pipeline.reporting.review:index_html",
    "report_tables": "pipeline.reporting.review:report_tables",
    "all_runs_table": "pipeline.results.all_runs:all_runs_table",
    "privacy_utility_figure": "pipeline.results.all_runs:privacy_utility_figure",
    "runtime_table": "pipeline.results.runtime:runtime_table",
    "runtime_figure": "pipeline.results.runtime:runtime_figure",
    "replay": "pipeline.privacy.replay:replay",
    "pretrain_public": "pipeline.training.pretrain:pretrain_public",
    "import_public": "pipeline.training.public:import_public",
    "export_bundle": "pipeline.bundles.bundle:export_bundle",
}

#: every stage: the core ones, then each method's own (listed by pipeline/methods/<method>/__init__.py)
STAGES: dict[str, str] = merge_stages(CORE_STAGES, method_stages())

#: the stages that run as N data-parallel processes under ``--nproc N`` (DP-SGD; :mod:`pipeline.distributed`), as each
#: method declares them (:attr:`pipeline.plugins.Method.data_parallel_stages`)
DATA_PARALLEL_STAGES: tuple[str, ...] = data_parallel_stages()

#: user-facing commands that are not DAG stages: name -> "module:main(argv) -> int".
EXTRA_COMMANDS: dict[str, str] = {
    "account": "pipeline.privacy.cli:main",
    "which": "pipeline.reporting.tables:which_main",
    "plan": "pipeline.plan:main",
    "gpu_check": "pipeline.gpu_check:main",
    "verify_bundle": "pipeline.bundles.cli:verify_main",
    "sample_bundle": "pipeline.bundles.cli:sample_main",
}


def load_stage(name: str) -> StageSpec:
    if name not in STAGES:
        raise PipelineError(f"unknown stage {name!r} (stages: {', '.join(sorted(STAGES))})")
    module, attr = STAGES[name].split(":")
    return getattr(importlib.import_module(module), attr)


def _pairs(items: list[str] | None, flag: str) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise PipelineError(f"{flag} {item!r}: expected KEY=PATH")
        if key in out:
            raise PipelineError(f"{flag} {key} given twice")
        out[key] = Path(value)
    return out


def _params(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    if text.startswith("@"):
        text = Path(text[1:]).read_text()
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PipelineError(f"--params: not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(params, dict):
        raise PipelineError("--params: expected a JSON object")
    return params


def _stage_parser(spec: StageSpec) -> argparse.ArgumentParser:
    lines = [spec.doc, ""]
    lines.append("inputs:  " + (" ".join(f"{k}=PATH" for k in spec.inputs) or "none"))
    if spec.any_inputs:
        lines.append("         any further KEY=PATH inputs are accepted")
    if spec.optional_inputs:
        lines.append("         optional: " + " ".join(f"{k}=PATH" for k in spec.optional_inputs))
    if spec.numbered_inputs:
        lines.append("         numbered: " + " ".join(f"{k}_0=PATH {k}_1=PATH ..." for k in spec.numbered_inputs))
    lines.append("outputs: " + (" ".join(f"{k}=PATH" for k in spec.outputs) or "none"))
    if spec.optional_outputs:
        lines.append("         optional: " + " ".join(f"{k}=PATH" for k in spec.optional_outputs))
    if spec.params:
        lines.append("params (JSON object):")
        lines += [f"  {k}: {v}" for k, v in spec.params.items()]
    p = argparse.ArgumentParser(prog=f"python -m pipeline {spec.name}", description="\n".join(lines),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--in", dest="inputs", nargs="*", metavar="KEY=PATH", default=[])
    p.add_argument("--out", dest="outputs", nargs="*", metavar="KEY=PATH", default=[])
    p.add_argument("--params", metavar="JSON|@FILE", help="stage parameters as a JSON object or @file")
    return p


def _split_option(argv: list[str], option: str, expected: str) -> tuple[list[str], str | None]:
    """Remove ``option VALUE`` from ``argv`` (anywhere after the stage name)."""
    if option not in argv:
        return argv, None
    i = argv.index(option)
    if i + 1 >= len(argv):
        raise PipelineError(f"{option}: expected {expected}")
    return argv[:i] + argv[i + 2:], argv[i + 1]


#: the log path a ``--nproc`` launch hands its ranks (torchrun's own parser takes ``--log`` for an ambiguous
#: abbreviation of its options, so it cannot travel on the ranks' command line)
RANK_LOG_ENV = "DPGEN_STAGE_LOG"


def _split_log(argv: list[str]) -> tuple[list[str], Path | None]:
    """Remove ``--log PATH`` from ``argv``; under torchrun, rank r > 0 logs beside it (``.rank<r>``)."""
    argv, path = _split_option(argv, "--log", "a file path")
    if path is None and launch.launched_size() > 1:
        path = os.environ.get(RANK_LOG_ENV) or None
    return argv, None if path is None else Path(launch.rank_log_path(path))


def _split_nproc(argv: list[str]) -> tuple[list[str], int]:
    """Remove ``--nproc N`` from ``argv``: N data-parallel processes (default 1)."""
    argv, value = _split_option(argv, "--nproc", "an integer >= 1")
    try:
        nproc = 1 if value is None else int(value)
    except ValueError:
        nproc = 0
    if nproc < 1:
        raise PipelineError(f"--nproc: expected an integer >= 1, got {value!r}")
    return argv, nproc


@contextlib.contextmanager
def _logging_to(path: Path | None) -> Iterator[TextIO]:
    """Send everything the stage prints (Python and C level, fds 1 and 2) to ``path``; yield the console.

    Rules call stages with ``--log {log:q}`` rather than ``> {log} 2>&1`` so that the one-line
    cause of a failure reaches the console too (Snakemake prints only the failed shell command),
    while progress and warnings stay in the job's log.
    """
    if path is None:
        yield sys.stderr
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    console = os.fdopen(os.dup(saved[2]), "w", buffering=1)
    streams = sys.stdout, sys.stderr
    with open(path, "w", buffering=1) as log_file:
        for fd in (1, 2):
            os.dup2(log_file.fileno(), fd)
        sys.stdout = sys.stderr = log_file  # Python-level writers too, wherever sys.std* pointed
        try:
            yield console
        finally:
            log_file.flush()
            sys.stdout, sys.stderr = streams
            for fd, dup in saved.items():
                os.dup2(dup, fd)
                os.close(dup)
            console.close()


def _run_stage(argv: list[str], console: TextIO, log_path: Path | None) -> int:
    name = argv[0]
    try:
        spec = load_stage(name)
        args = _stage_parser(spec).parse_args(argv[1:])
        spec(_pairs(args.inputs, "--in"), _pairs(args.outputs, "--out"), _params(args.params))
    except (PipelineError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        if log_path is not None:
            print(f"error: {name}: {exc}", file=console)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C / SIGTERM; training loops save their state first and say where
        message = f"interrupted: {exc}" if str(exc) else f"interrupted: {name}"
        print(message, file=sys.stderr)
        if log_path is not None:
            print(message, file=console)
        return int(getattr(exc, "exit_code", 130))  # the shell's 128 + signal
    except Exception as exc:  # a bug, not bad input: the traceback goes to the log, its last line to the console
        if log_path is None:
            raise
        traceback.print_exc()
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(f"error: {name} failed with {type(exc).__name__}: {first} (traceback in {log_path})", file=console)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m pipeline STAGE [--in KEY=PATH ...] [--out KEY=PATH ...] [--params JSON] [--log FILE]\n")
        print("stages:")
        for name in STAGES:
            print(f"  {name}")
        if EXTRA_COMMANDS:
            print("\ncommands:")
            for name in EXTRA_COMMANDS:
                print(f"  {name}")
        print("\n`python -m pipeline STAGE --help` shows a stage's inputs, outputs and params.")
        print("--log FILE sends the stage's output to FILE; an error's one-line cause is printed on the console too.")
        print("--nproc N runs a DP-SGD training stage as N data-parallel processes (torchrun; one GPU each under "
              "CUDA, gloo CPU processes otherwise).")
        return 0
    if argv[0] in EXTRA_COMMANDS:
        module, attr = EXTRA_COMMANDS[argv[0]].split(":")
        return int(getattr(importlib.import_module(module), attr)(argv[1:]) or 0)
    try:
        argv, nproc = _split_nproc(argv)
        argv, log_path = _split_log(argv)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if nproc > 1 and argv[0] not in DATA_PARALLEL_STAGES:
        print(f"error: --nproc {nproc}: stage {argv[0]} does not run data-parallel (only "
              f"{', '.join(DATA_PARALLEL_STAGES)})", file=sys.stderr)
        return 2
    if nproc > 1 and launch.launched_size() == 1:
        # torchrun's agent takes this process's place: SLURM's and Snakemake's signals reach it, and it
        # forwards them to the ranks (each finishes its step and rank 0 saves the state)
        command = launch.launch_argv(nproc, argv)
        env = {**os.environ, **({} if log_path is None else {RANK_LOG_ENV: str(log_path)})}
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(command[0], command, env)
    with _logging_to(log_path) as console:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        return _run_stage(argv, console, log_path)
