"""The slurm profile against a real SLURM cluster.

A tiny configuration of the real DAG (data -> evaluation net and evaluation, both declaring
`gpu=1` -> the reference_real table) goes through `snakemake --profile profiles/slurm`, and
SLURM's own accounting (`sacct`) is the witness: every job ran in the partition from
DPGEN_SLURM_PARTITION with the runtime, memory and GPU its rule declares; a job killed while
running is resubmitted once (the profile's `retries`), then the run fails and a rerun
submits only what is missing; a job that fails makes Snakemake exit non-zero and print the
job's SLURM log. Needs a live cluster (conftest.py); `.ci/run` starts one with .ci/slurm/.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pipeline.data.layout import CIFAR10_FILES, CIFAR10_FOLDER
from tests.test_workflow import TINY

pytestmark = pytest.mark.slurm

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# The executor's first status check comes this many seconds after a submission, the next
# ones 10 s further apart each until a job finishes (3, 16, 39, 72 s): its default (40 s)
# spares a busy controller, while a tiny job here takes 10-40 s.
FAST_STATUS = ("--slurm-init-seconds-before-status-checks", "3")
SACCT_FIELDS = ("JobID", "Comment", "Partition", "Account", "State", "Timelimit", "AllocTRES")
# a hung status loop must fail the test, not stall CI (a tiny run takes 1-4 min)
RUN_TIMEOUT_S = 480


@dataclass
class Run:
    """One `snakemake --profile profiles/slurm` invocation and the SLURM jobs it submitted."""

    returncode: int
    output: str
    logdir: Path
    killed: list[str] = field(default_factory=list)

    def explain(self) -> str:
        """Snakemake's last words and every SLURM log left (the executor keeps failed ones)."""
        logs = [f"---- {log}\n{log.read_text()[-2000:]}" for log in sorted(self.logdir.rglob("*.log"))]
        return "\n".join([self.output[-3000:], *logs])

    @property
    def run_id(self) -> str:
        # the executor names every job of one invocation after this id (sbatch --job-name)
        match = re.search(r"SLURM run ID: (\S+)", self.output)
        assert match, self.output[-3000:]
        return match.group(1)

    def jobs(self) -> list[dict[str, str]]:
        return sacct(self.run_id)

    def rules(self) -> list[str]:
        return sorted(job["rule"] for job in self.jobs())


def sacct(run_id: str) -> list[dict[str, str]]:
    """SLURM's accounting record of every job named `run_id` (allocations, not steps)."""
    res = subprocess.run(
        ["sacct", "-X", "-P", "-n", "--starttime", "now-1days", "--name", run_id,
         "-o", ",".join(SACCT_FIELDS)],
        capture_output=True, text=True, timeout=30, check=True)
    jobs = [dict(zip(SACCT_FIELDS, line.split("|"))) for line in res.stdout.splitlines()]
    for job in jobs:
        job["rule"] = job["Comment"].removeprefix("rule_")  # the executor's --comment
    return jobs


def minutes(timelimit: str) -> int:
    """sacct's [D-]HH:MM:SS time limit in minutes."""
    days, _, hms = timelimit.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return (int(days or 0) * 24 + h) * 60 + m + (s > 0)


def declared_resources(output: str) -> dict[str, dict[str, str]]:
    """Rule -> the resources Snakemake printed for its job ('resources: mem_mb=4000, ...')."""
    rules: dict[str, dict[str, str]] = {}
    current = None
    for line in output.splitlines():
        if match := re.match(r"(?:local)?rule (\w+):$", line):
            current = match.group(1)
        elif current and line.strip().startswith("resources:"):
            pairs = line.split(":", 1)[1].strip().split(", ")
            rules[current] = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
    return rules


def alloc_tres(job: dict[str, str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in job["AllocTRES"].split(",") if "=" in item)


class Snakemake:
    """Runs the workflow of `repo` under the slurm profile with one config file."""

    def __init__(self, repo: Path, workdir: Path, config: dict, partition: str):
        self.repo = repo
        self.configfile = workdir / f"{config['experiment']}.yaml"
        self.configfile.write_text(yaml.safe_dump(config))
        self.logdir = workdir / "slurm_logs"
        self.out = workdir / f"{config['experiment']}.out"
        # jobs inherit this environment (sbatch --export=ALL): the venv's python on PATH
        self.env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                    "DPGEN_SLURM_PARTITION": partition}
        self.run_ids: list[str] = []

    def start(self, *args: str) -> subprocess.Popen:
        # targets (and options) before --configfile, which takes several values
        cmd = [SNAKEMAKE, "--profile", "profiles/slurm", *args, "--configfile", str(self.configfile),
               *FAST_STATUS, "--slurm-logdir", str(self.logdir)]
        with self.out.open("w") as out:
            return subprocess.Popen(cmd, cwd=self.repo, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def finish(self, proc: subprocess.Popen, killed: list[str] | None = None) -> Run:
        try:
            proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # Ctrl-C: the executor cancels its jobs (SIGTERM would wait)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            pytest.fail(f"snakemake ran over {RUN_TIMEOUT_S} s:\n{self.out.read_text()[-3000:]}")
        run = Run(proc.returncode, self.out.read_text(), self.logdir, killed or [])
        self.run_ids.append(run.run_id)
        return run

    def run(self, *args: str) -> Run:
        return self.finish(self.start(*args))

    def run_killing(self, rule: str, *targets: str) -> Run:
        """Run, cancelling (scancel) every job of `rule` as soon as SLURM reports it running."""
        proc = self.start(*targets)
        killed: list[str] = []
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            match = re.search(r"SLURM run ID: (\S+)", self.out.read_text())
            if match:
                queue = subprocess.run(["squeue", "-h", "-t", "RUNNING", "--name", match.group(1), "-o", "%i|%k"],
                                       capture_output=True, text=True, timeout=30).stdout
                for jobid, comment in (line.split("|", 1) for line in queue.split()):
                    if comment == f"rule_{rule}" and jobid not in killed:
                        subprocess.run(["scancel", jobid], check=True, timeout=30)
                        killed.append(jobid)
            time.sleep(0.5)
        return self.finish(proc, killed)

    def cancel_leftovers(self) -> None:
        for run_id in self.run_ids:
            subprocess.run(["scancel", "--name", run_id], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def tiny(repo, tmp_path_factory, slurm_partition):
    """The tiny DAG to the reference_real table: a first run whose evaluation-net job is
    killed on every attempt, then a plain rerun."""
    workdir = tmp_path_factory.mktemp("slurm")
    results = workdir / "results"
    sm = Snakemake(repo, workdir, {**TINY, "experiment": "tiny_slurm", "results_dir": str(results)},
                   slurm_partition)
    target = str(results / "tables" / "reference_real.parquet")
    try:
        # with the plugin's sacct status query this run would never end ("CANCELLED by 0"
        # is not a failure state to it): the profile's squeue status command is under test
        first = sm.run_killing("train_evalnet", target)
        data = {p: p.stat().st_mtime_ns for p in (results / "tiny_slurm" / "data").glob("*.npz")}
        rerun = sm.run(target)
    finally:
        sm.cancel_leftovers()
    return {"first": first, "rerun": rerun, "results": results, "data_mtimes": data, "partition": slurm_partition}


def test_tiny_dag_completes_through_slurm(tiny):
    rerun = tiny["rerun"]
    assert rerun.returncode == 0, rerun.explain()
    table = pd.read_parquet(tiny["results"] / "tables" / "reference_real.parquet")
    assert len(table) == 1
    assert all(job["State"] == "COMPLETED" for job in rerun.jobs()), rerun.jobs()


def test_every_job_runs_with_the_resources_its_rule_declares(tiny):
    """Partition from the environment, account if given, and the rule's runtime, memory and
    GPU as SLURM allocated them (a GPU job's allocation holds gres/gpu)."""
    declared = {**declared_resources(tiny["first"].output), **declared_resources(tiny["rerun"].output)}
    jobs = tiny["first"].jobs() + tiny["rerun"].jobs()
    gpu_rules = {job["rule"] for job in jobs if declared[job["rule"]].get("gpu") == "1"}
    assert "train_evalnet" in gpu_rules and len(gpu_rules) < len({job["rule"] for job in jobs})
    for job in jobs:
        want = declared[job["rule"]]
        tres = alloc_tres(job)
        assert job["Partition"] == tiny["partition"], job
        if os.environ.get("DPGEN_SLURM_ACCOUNT"):
            assert job["Account"] == os.environ["DPGEN_SLURM_ACCOUNT"], job
        assert minutes(job["Timelimit"]) == int(want["runtime"]), (job, want)
        assert tres.get("mem") == f"{want['mem_mb']}M", (job, want)
        assert (tres.get("gres/gpu") == "1") == (job["rule"] in gpu_rules), (job, want)


def test_killed_job_is_retried_once_then_a_rerun_submits_only_what_is_missing(tiny):
    first, rerun = tiny["first"], tiny["rerun"]
    assert first.returncode != 0, first.explain()
    # retries: 1 in the profile: the killed job was submitted twice, and both were cancelled
    assert len(first.killed) == 2, first.explain()
    states = {job["JobID"]: (job["rule"], job["State"].split()[0]) for job in first.jobs()}
    assert {states[j] for j in first.killed} == {("train_evalnet", "CANCELLED")}
    assert ("prepare_data", "COMPLETED") in states.values()
    assert "prepare_data" not in rerun.rules()
    assert rerun.rules() == ["evaluate_reference_real", "reference_real", "train_evalnet"], rerun.explain()
    data = tiny["data_mtimes"]
    assert data and all(p.stat().st_mtime_ns == t for p, t in data.items())


def test_failing_job_fails_the_run_and_prints_its_slurm_log(repo, tmp_path, slurm_partition):
    # a real user error: the dataset's files are there but unreadable (a missing one stops the run
    # before any job is submitted: tests/test_workflow.py)
    batches = tmp_path / "bad" / CIFAR10_FOLDER
    batches.mkdir(parents=True)
    for name in CIFAR10_FILES:
        (batches / name).write_bytes(b"not a pickle")
    config = {**TINY, "experiment": "no_data", "results_dir": str(tmp_path / "results"),
              "data": {**TINY["data"], "data_root": str(tmp_path / "bad"),
                       "private": {**TINY["data"]["private"], "source": "cifar10"}}}
    sm = Snakemake(repo, tmp_path, config, slurm_partition)
    try:
        # no resubmission: retries are the killed-job test's subject, and each costs a minute
        run = sm.run(str(tmp_path / "results" / "no_data" / "data" / "private_train.npz"), "--retries", "0")
    finally:
        sm.cancel_leftovers()
    assert run.returncode != 0
    assert [(job["rule"], job["State"]) for job in run.jobs()] == [("prepare_data", "FAILED")]
    logs = set(re.findall(rf"{re.escape(str(sm.logdir))}/rule_prepare_data/\d+\.log", run.output))
    assert {Path(log).name for log in logs} == {f"{job['JobID']}.log" for job in run.jobs()}
    for log in logs:
        assert "Error in rule prepare_data" in Path(log).read_text()
    # show-failed-logs: the stage's one-line error (its log's last line) is in Snakemake's output
    error = (tmp_path / "results" / "no_data" / "logs" / "prepare_data.log").read_text().splitlines()[-1]
    assert error.startswith("error: ") and f"could not read the batches in {batches}" in error
    assert error in run.output
