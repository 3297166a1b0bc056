"""`python -m pipeline plan`: a configuration's cluster requests summed per rule, and jobs fitted to the time limit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import rates
from pipeline import resources as cost
from pipeline.plugins import resumable_rules
from pipeline.plan import Job, parse_dry_run, plan_lines, render

DRY_RUN = """Building DAG of jobs...
rule train_straightdp:
    input: a
    output: b
    wildcards: run=uniform_moments_eps1_seed0
    resources: tmpdir=<TBD>, gpu=1, mem_mb=6000, mem_mib=5723, runtime=19926, slurm_partition=
rule train_straightdp:
    resources: tmpdir=<TBD>, gpu=1, mem_mb=6000, runtime=600
rule release_moments:
    resources: tmpdir=<TBD>, mem_mb=4000, runtime=10
localrule all:
    input: x
    resources: tmpdir=<TBD>, mem_mb=1000, runtime=60
rule sensgeo_table_sdp:
    resources: tmpdir=<TBD>, mem_mb=3000, runtime=4000
"""


def test_the_dry_run_listing_gives_every_submitted_job_and_its_requests():
    jobs = parse_dry_run(DRY_RUN)
    assert jobs == [Job("train_straightdp", 19926, 6000, 1), Job("train_straightdp", 600, 6000, 1),
                    Job("release_moments", 10, 4000, 0), Job("sensgeo_table_sdp", 4000, 3000, 0)]  # not localrule all


def test_a_resumable_job_over_the_limit_runs_in_segments_and_any_other_does_not_fit():
    lines = {r.rule: r for r in plan_lines(parse_dry_run(DRY_RUN), max_job_minutes=48 * 60)}
    train = lines["train_straightdp"]
    assert (train.jobs, train.gpu_jobs, train.segments, train.fits) == (2, 2, 7, True)  # 332.1 h in 48 h pieces
    assert train.gpu_hours == pytest.approx((19926 + 600) / 60) and train.longest_h == pytest.approx(332.1)
    assert lines["release_moments"].gpu_hours == 0 and lines["release_moments"].fits
    assert not lines["sensgeo_table_sdp"].fits  # 66.7 h, cannot resume
    assert all(r.fits and r.segments == 1 for r in plan_lines(parse_dry_run(DRY_RUN), max_job_minutes=None))
    note = rates.device_rates({}).describe()
    table = render(list(lines.values()), title="t", max_job_minutes=48 * 60, rates_note=note)
    assert "job time limit 48 h" in table and "rates: estimates, not a GPU measurement (entry a100-40gb" in table
    assert re.search(r"\| \*\*total\*\* \| 4 \| 2 \| .* \| NO \|$", table)


@pytest.mark.parametrize("hours, minutes, runtime, retries, segments", [
    (None, 19926, 19926, None, 1),   # no limit: the prediction, and Snakemake's own --retries
    (48, 19926, 2880, 7, 7),         # 7 segments: 6 resubmissions + the transient-failure one
    (48, 2880, 2880, 1, 1),          # exactly the limit: one segment
    (48, 100, 100, 1, 1),
])
def test_a_resumable_job_asks_for_at_most_the_limit_and_is_resubmitted_until_its_prediction_is_covered(
        hours, minutes, runtime, retries, segments):
    config = {"slurm": {"max_job_hours": hours}}
    assert cost.segment_runtime_min(config, minutes) == runtime
    assert cost.segment_retries(config, minutes) == retries
    assert cost.segments(config, minutes) == segments


class Wildcards(dict):
    """A job's wildcards as Snakemake passes them to a resource function: by attribute and by key."""

    __getattr__ = dict.__getitem__


#: the wildcards of one job of each rule whose runtime is its own job's
JOB_WILDCARDS = {"train_dpdm": {"run": "edm_eps1_K1_seed0"},
                 "empden_sample_subsampled": {"method": "hybrid", "p": "50", "B": "100", "T": "3", "beta": "1",
                                              "seed": "0"},
                 "empden_sample_full_batch": {"smin": "0p002", "beta": "1", "seed": "0"},
                 "empden_sample_public_only": {"seed": "0"}}


def test_the_resumable_rules_are_exactly_those_whose_requests_are_segmented(repo, tmp_path):
    """Under a one-minute time limit a resumable rule asks for the limit (it runs in segments), every other rule for
    its whole prediction (at least 5 minutes)."""
    from pipeline.methods.accounting.wiring import Wiring as Accounting
    from pipeline.methods.audit.wiring import Wiring as Audit
    from pipeline.methods.baselines.wiring import Wiring as Baselines
    from pipeline.methods.dpdm.wiring import Wiring as Dpdm
    from pipeline.methods.empden.wiring import Wiring as Empden
    from pipeline.methods.empden_diagnostics.wiring import Wiring as EmpdenDiagnostics
    from pipeline.methods.sensgeo.wiring import Wiring as Sensgeo
    from pipeline.methods.straightdp.wiring import Wiring as Straightdp
    from tests.methods import house, rule_resources

    h = house(tmp_path, lambda cfg: cfg.update(slurm={"max_job_hours": 1 / 60}))
    owners = {"HOUSE": h, "ACCOUNTING": Accounting(h), "AUDIT": Audit(h, lambda methods: {}), "BASELINES": Baselines(h),
              "DPDM": Dpdm(h), "EMPDEN": Empden(h), "EMPDEN_DIAGNOSTICS": EmpdenDiagnostics(h), "SENSGEO": Sensgeo(h),
              "STRAIGHTDP": Straightdp(h)}
    segmented, text = set(), ""
    for smk in sorted((repo / "rules").glob("*.smk")):
        text += smk.read_text()
        for rule, directive in rule_resources(smk.name).items():
            runtime = owners[re.match(r"\*\*(\w+)\.", directive).group(1)].resources(rule)["runtime"]
            if callable(runtime):
                runtime = runtime(Wildcards(JOB_WILDCARDS.get(rule, {})))
            if runtime == 1:
                segmented.add(rule)
            else:
                assert runtime >= 5, (rule, runtime)
    inherited = set(re.findall(r"use rule (\w+) as (\w+) with", text))
    names = segmented | {new for old, new in inherited if old in segmented}
    assert names == set(cost.HOUSE_RESUMABLE_RULES) | set(resumable_rules())


@pytest.mark.slow
def test_the_plan_of_a_paper_preset_fits_every_job_in_the_limit_and_the_rules_request_no_more(repo, tmp_path):
    res = subprocess.run([sys.executable, "-m", "pipeline", "plan", "--configfile", "configs/cifar10.yaml",
                          "--max-job-hours", "48"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    # public pretraining's counted 200 Mimg at the default entry (a100-40gb): ~301 h, in 48 h segments
    row = next(line for line in res.stdout.splitlines() if line.startswith("| pretrain_public |"))
    assert row.split("|")[7].strip() == "7" and row.endswith("| yes |")
    # the rules themselves: with the limit in the config no job of the dry run asks for more than 48 h
    dry = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--forceall", "--profile", "profiles/slurm", "all",
                          "--configfile", "configs/cifar10.yaml", "--config", "slurm={max_job_hours: 48}",
                          f"results_dir={tmp_path}"], cwd=repo, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "DPGEN_PLAN_ONLY": "1"})
    assert dry.returncode == 0, dry.stderr[-2000:]
    jobs = parse_dry_run(dry.stdout)
    assert jobs and max(j.runtime_min for j in jobs) == 48 * 60


def test_a_job_s_predicted_gpu_memory_is_shown_and_one_over_the_declared_gpu_does_not_fit():
    listing = ("rule pretrain_public:\n    resources: tmpdir=<TBD>, gpu=1, mem_mb=16000, runtime=2010, gpu_mem_mb=30271\n"
               "rule empden_sample_subsampled:\n    resources: tmpdir=<TBD>, gpu=1, mem_mb=4000, runtime=60\n"
               "rule export_bundle:\n    resources: tmpdir=<TBD>, mem_mb=4000, runtime=15\n")
    jobs = parse_dry_run(listing)
    assert jobs[0] == Job("pretrain_public", 2010, 16000, 1, 30271) and jobs[1].gpu_mem_mb is None
    fits = {r.rule: r for r in plan_lines(jobs, None, gpu_mem_gb=40)}
    assert fits["pretrain_public"].gpu_mem_gb == pytest.approx(29.56, abs=0.01) and fits["pretrain_public"].fits_gpu
    table = render(list(fits.values()), title="t", max_job_minutes=None, rates_note="r", gpu_mem_gb=40)
    assert "GPU memory 40 GB per GPU (slurm.gpu_mem_gb)" in table
    assert "| pretrain_public | 1 | 1 | 33.5 | 33.5 | 33.5 | 1 | 16.0 | 29.6 | yes |" in table
    assert "| empden_sample_subsampled | 1 | 1 | 1.0 | 1.0 | 1.0 | 1 | 4.0 | not modelled | yes |" in table
    assert "| export_bundle | 1 | 0 | 0.2 | 0.0 | 0.2 | 1 | 4.0 |  | yes |" in table
    small = {r.rule: r for r in plan_lines(jobs, None, gpu_mem_gb=24)}
    assert not small["pretrain_public"].fits_gpu and small["empden_sample_subsampled"].fits_gpu
    assert render(list(small.values()), title="t", max_job_minutes=None, rates_note="r",
                  gpu_mem_gb=24).endswith("| 29.6 | NO |")


#: the embedded default and every configuration the repository ships: each one's DAG is what a user submits
SHIPPED_CONFIGS = ([], *[[f"configs/{p.name}"] for p in sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))],
                   *[[f"configs/diagnostics/{p.name}"]
                     for p in sorted((Path(__file__).parents[1] / "configs" / "diagnostics").glob("*.yaml"))])


@pytest.mark.slow
@pytest.mark.parametrize("configfiles", SHIPPED_CONFIGS, ids=lambda c: c[0] if c else "config.yaml")
def test_every_gpu_job_of_a_shipped_configuration_has_a_gpu_memory_prediction_that_fits_its_declared_gpu(
        repo, configfiles):
    """Issue #55: no GPU job is submitted unchecked. The plan's GPU-memory column names a prediction for every rule
    with a GPU job (none says ``not modelled``) and the plan refuses none (exit status 0)."""
    res = subprocess.run([sys.executable, "-m", "pipeline", "plan", *(["--configfile", *configfiles] if configfiles
                                                                       else []), "--max-job-hours", "48"],
                         cwd=repo, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [line for line in res.stdout.splitlines() if line.startswith("| ") and not line.startswith("| rule ")]
    gpu_rows = [r for r in rows if r.split("|")[3].strip() not in ("0", "---:")]
    assert gpu_rows, res.stdout
    assert [r for r in gpu_rows if "not modelled" in r] == []
    assert all(r.endswith("| yes |") for r in gpu_rows)


@pytest.mark.slow
def test_the_cifar10_preset_plans_its_public_pretraining_as_micro_batches_that_fit_and_cpu_jobs_on_their_partition(
        repo, tmp_path):
    dry = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--forceall", "--profile", "profiles/slurm", "all",
                          "-p", "--configfile", "configs/cifar10.yaml",
                          "--config", "slurm={gpu_mem_gb: 40, cpu_partition: cpuq}", f"results_dir={tmp_path}"],
                         cwd=repo, capture_output=True, text=True, timeout=300, env={**os.environ, "DPGEN_PLAN_ONLY": "1"})
    assert dry.returncode == 0, dry.stderr[-2000:]
    jobs = parse_dry_run(dry.stdout)
    pretrain = next(j for j in jobs if j.rule == "pretrain_public")
    assert pretrain.gpu_mem_mb is not None and pretrain.gpu_mem_mb <= 40 * 1024
    command = next(line for line in dry.stdout.splitlines() if "pipeline pretrain_public" in line)
    params = json.loads(re.search(r"--params '(\{.*?\})'", command).group(1))
    assert params["pretrain"]["batch_size"] == 512 and 1 <= params["batch_gpu"] < 512
    # slurm.cpu_partition: a job without a GPU goes there, a GPU job keeps the default partition
    blocks = re.findall(r"^rule (\S+):\n(?:.*\n)*?\s+resources: (.*)$", dry.stdout, flags=re.M)
    assert blocks
    for rule, resources in blocks:
        gpu = re.search(r"\bgpu=(\d+)", resources)
        partition = re.search(r"slurm_partition=([^,]*)", resources).group(1)
        assert partition == ("" if gpu and int(gpu.group(1)) else "cpuq"), (rule, resources)
