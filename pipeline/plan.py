"""``python -m pipeline plan``: what a configuration will ask a cluster for, before anything is submitted.

Every job's request comes from the cost models the rules use (each method's ``pipeline/methods/<method>/costs.py``,
the house's :mod:`pipeline.resources`): the plan asks Snakemake for a dry run of the slurm profile
(``snakemake -n --profile profiles/slurm all``),
reads each job's ``runtime``, ``mem_mb``, ``gpu`` and predicted ``gpu_mem_mb`` as the profile would submit them, and sums them
per rule. The dry run is made without ``slurm.max_job_hours`` so that it shows each job's whole
predicted time; the limit is then applied here with the same functions the rules call
(:func:`pipeline.resources.segments`): a resumable training job over the limit runs as several
segments of at most the limit, any other job over it is listed as not fitting (exit status 1).

The rates behind the predictions are the entry of ``pipeline/device_rates.yaml`` that
``slurm.device_rates`` names (:mod:`pipeline.rates`): ``estimate`` by default (2-core CPU rates and
published GPU throughput, not a GPU measurement), or one ``make gpu-check`` measured; the plan's
second line says which.

GPU memory: each job of a rule with a GPU-memory model carries its predicted peak on one GPU (resource
``gpu_mem_mb``, :func:`pipeline.resources.memory_plan` and :func:`~pipeline.resources.dpsgd_memory`, from the
activations counted on its network, :mod:`pipeline.footprint`); the plan shows the largest per rule and marks a
rule over ``slurm.gpu_mem_gb`` ``NO`` with one line naming it, its prediction and the limit (exit status 1).

    python -m pipeline plan --configfile configs/cifar10.yaml [--max-job-hours 48]
    make plan CONFIG=configs/cifar10.yaml
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline import rates
from pipeline import resources as cost
from pipeline.config import load_config
from pipeline.plugins import resumable_rules

_RULE = re.compile(r"^(local)?rule (\S+?):\s*$")
_RESOURCES = re.compile(r"^\s+resources:\s*(.*)$")


@dataclass(frozen=True)
class Job:
    """One planned job: its rule and what it asks for (minutes, MB, GPUs)."""

    rule: str
    runtime_min: int
    mem_mb: int
    gpus: int
    gpu_mem_mb: int | None = None


@dataclass(frozen=True)
class RuleLine:
    """One rule's line of the plan."""

    rule: str
    jobs: int
    gpu_jobs: int
    hours: float
    gpu_hours: float
    longest_h: float
    segments: int
    mem_gb: float
    fits: bool
    gpu_mem_gb: float | None = None
    fits_gpu: bool = True


def parse_dry_run(text: str) -> list[Job]:
    """The submitted jobs of a ``snakemake -n`` listing: each ``rule NAME:`` block and its ``resources:`` line
    (``localrule`` blocks run on the submitting machine and ask the cluster for nothing)."""
    jobs: list[Job] = []
    rule: str | None = None
    for line in text.splitlines():
        head = _RULE.match(line)
        if head:
            rule = None if head.group(1) else head.group(2)
            continue
        res = _RESOURCES.match(line)
        if res and rule is not None:
            fields = dict(kv.split("=", 1) for kv in (p.strip() for p in res.group(1).split(",")) if "=" in kv)
            gpu_mem = fields.get("gpu_mem_mb")
            jobs.append(Job(rule, int(float(fields.get("runtime", 0))), int(float(fields.get("mem_mb", 0))),
                            int(float(fields.get("gpu", 0))), None if gpu_mem is None else int(float(gpu_mem))))
            rule = None
    return jobs


def plan_lines(jobs: Sequence[Job], max_job_minutes: int | None, gpu_mem_gb: float | None = None) -> list[RuleLine]:
    """Per rule: job count, predicted hours (every job, every segment), GPU-hours, the longest job, how many
    segments it runs as, the largest memory request, whether every job fits the limit, the largest predicted GPU
    memory (rules with a GPU-memory model, resource ``gpu_mem_mb``) and whether it fits ``gpu_mem_gb``."""
    config = {"slurm": {"max_job_hours": None if max_job_minutes is None else max_job_minutes / 60}}
    segmented = set(cost.HOUSE_RESUMABLE_RULES) | set(resumable_rules())
    out = []
    for rule in sorted({j.rule for j in jobs}):
        mine = [j for j in jobs if j.rule == rule]
        longest = max(j.runtime_min for j in mine)
        resumable = rule in segmented
        fits = max_job_minutes is None or longest <= max_job_minutes or resumable
        hours = sum(j.runtime_min for j in mine) / 60
        gpu_mem = [j.gpu_mem_mb for j in mine if j.gpu_mem_mb is not None]
        gpu_mem_max = max(gpu_mem) / 1024 if gpu_mem else None
        out.append(RuleLine(rule, len(mine), sum(1 for j in mine if j.gpus), hours,
                            sum(j.runtime_min * j.gpus for j in mine) / 60, longest / 60,
                            cost.segments(config, longest) if resumable else 1,
                            max(j.mem_mb for j in mine) / 1000, fits, gpu_mem_max,
                            gpu_mem_gb is None or gpu_mem_max is None or gpu_mem_max <= gpu_mem_gb))
    return sorted(out, key=lambda r: -r.hours)


def render(lines: Sequence[RuleLine], *, title: str, max_job_minutes: int | None, rates_note: str,
           gpu_mem_gb: float | None = None) -> str:
    """The plan as a Markdown table with a totals row, under its title and what its rates are (``rates_note``).
    The GPU-memory column is each rule's largest predicted peak on one GPU, where the rule has a GPU-memory
    model (``not modelled`` otherwise: its job is not checked against ``gpu_mem_gb``)."""
    limit = "no limit (slurm.max_job_hours unset)" if max_job_minutes is None else f"{max_job_minutes / 60:g} h"
    gpu_limit = "" if gpu_mem_gb is None else f"; GPU memory {gpu_mem_gb:g} GB per GPU (slurm.gpu_mem_gb)"
    rows = ["| rule | jobs | GPU jobs | hours | GPU-hours | longest job (h) | segments | memory per job (GB) | "
            "GPU memory per job (GB) | fits |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]

    def gpu_mem(r: RuleLine) -> str:
        return "" if not r.gpu_jobs else "not modelled" if r.gpu_mem_gb is None else f"{r.gpu_mem_gb:.1f}"

    for r in lines:
        rows.append(f"| {r.rule} | {r.jobs} | {r.gpu_jobs} | {r.hours:,.1f} | {r.gpu_hours:,.1f} | {r.longest_h:,.1f} | "
                    f"{r.segments} | {r.mem_gb:.1f} | {gpu_mem(r)} | {'yes' if r.fits and r.fits_gpu else 'NO'} |")
    modelled = [r.gpu_mem_gb for r in lines if r.gpu_mem_gb is not None]
    rows.append(f"| **total** | {sum(r.jobs for r in lines)} | {sum(r.gpu_jobs for r in lines)} | "
                f"{sum(r.hours for r in lines):,.1f} | {sum(r.gpu_hours for r in lines):,.1f} | "
                f"{max((r.longest_h for r in lines), default=0):,.1f} | | {max((r.mem_gb for r in lines), default=0):.1f} "
                f"| {f'{max(modelled):.1f}' if modelled else ''} | {'yes' if all(r.fits and r.fits_gpu for r in lines) else 'NO'} |")
    return "\n".join([f"plan of {title}: job time limit {limit}{gpu_limit}", rates_note, "", *rows])


def dry_run(configfiles: Sequence[str], *, profile: str, repo: Path) -> str:
    """The slurm profile's dry run of ``all`` for ``configfiles`` with no job time limit (stdout)."""
    cmd = [sys.executable, "-m", "snakemake", "-n", "--forceall", "--profile", profile, "all",
           *(["--configfile", *configfiles] if configfiles else []), "--config", "slurm={max_job_hours: null}"]
    # DPGEN_PLAN_ONLY: rules/common.smk skips the datasets' presence check (a plan reads no data)
    res = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, env={**os.environ, "DPGEN_PLAN_ONLY": "1"})
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"plan: the dry run failed: {tail}")
    return res.stdout


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--configfile", nargs="+", default=[], help="config files merged over config.yaml")
    parser.add_argument("--max-job-hours", type=float, default=None,
                        help="the partition's time limit (default: the config's slurm.max_job_hours)")
    parser.add_argument("--profile", default="profiles/slurm", help="Snakemake profile (default profiles/slurm)")
    args = parser.parse_args(argv)
    repo = Path(__file__).resolve().parents[1]
    files = [_located(f, repo) for f in args.configfile]
    config = load_config(repo / "config.yaml", *files)
    hours = args.max_job_hours if args.max_job_hours is not None else config["slurm"]["max_job_hours"]
    limit = None if hours is None else cost.max_job_minutes({"slurm": {"max_job_hours": hours}})
    gpu_gb = cost.gpu_mem_gb_limit(config)
    lines = plan_lines(parse_dry_run(dry_run(files, profile=args.profile, repo=repo)), limit, gpu_gb)
    print(render(lines, title=" + ".join(["config.yaml", *args.configfile]), max_job_minutes=limit,
                 rates_note=rates.device_rates(config).describe(), gpu_mem_gb=gpu_gb))
    too_long = [r.rule for r in lines if not r.fits]
    if too_long:
        print(f"\nplan: jobs of {', '.join(too_long)} need more than the limit and cannot resume", file=sys.stderr)
    for r in lines:
        if not r.fits_gpu:
            print(f"plan: rule {r.rule} is predicted to use {r.gpu_mem_gb:.1f} GB of GPU memory, more than "
                  f"slurm.gpu_mem_gb = {gpu_gb:g} GB", file=sys.stderr)
    return 1 if too_long or not all(r.fits_gpu for r in lines) else 0


def _located(configfile: str, repo: Path) -> str:
    """``configfile`` as an absolute path (as given, else under the repository, where the dry run starts)."""
    for path in (Path(configfile), repo / configfile):
        if path.is_file():
            return str(path.resolve())
    raise SystemExit(f"plan: config file {configfile} not found")
