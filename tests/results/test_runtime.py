"""runtime.parquet: one row per job from Snakemake's own benchmark files, and the top-rules figure."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from pipeline.results.runtime import by_rule, job_cost, runtime_figure, runtime_figure_of, runtime_frame, runtime_table
from pipeline.stage import PipelineError

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def bench(root, rule, job, wall, cpu, rss, earlier=None):
    path = root / rule / f"{job}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{w}\t0:00:00\t{r}\t1\t1\t1\t0\t0\t50\t{c}\n" for w, c, r in (earlier or [])]
    path.write_text(HEADER + "".join(lines) + f"{wall}\t0:00:00\t{rss}\t1\t1\t1\t0\t0\t50\t{cpu}\n")
    return path


@pytest.fixture()
def root(tmp_path):
    r = tmp_path / "benchmarks"
    bench(r, "train_dpdm", "edm_eps1_seed0", 600.0, 1100.0, 2000.0)
    bench(r, "train_dpdm", "edm_eps10_seed0", 500.0, 900.0, 2100.0)
    # a wildcard with a slash (run/sampler) stays one job; a re-run's file: its last line counts
    bench(r, "sample_dpdm", "edm_eps1_seed0/ddim", 60.0, 50.0, 900.0, earlier=[(999.0, 999.0, 9999.0)])
    bench(r, "prepare_data", "job", 5.0, 4.0, "-")  # Snakemake writes '-' where it could not measure
    return r


def test_one_row_per_job_with_wall_cpu_and_rss(root):
    df = runtime_frame(root)
    assert len(df) == 4
    row = df[(df["rule"] == "sample_dpdm")].iloc[0]
    assert row["job"] == "edm_eps1_seed0/ddim"
    assert (row["wall_s"], row["cpu_s"], row["max_rss_mb"]) == (60.0, 50.0, 900.0)
    assert row["cpu_utilisation"] == pytest.approx(50.0 / 60.0)
    assert math.isnan(df[df["rule"] == "prepare_data"].iloc[0]["max_rss_mb"])
    assert df.dtypes["wall_s"] == float and df.dtypes["max_rss_mb"] == float


def test_rules_are_ranked_by_summed_wall_time(root):
    g = by_rule(runtime_frame(root))
    assert list(g.index) == ["train_dpdm", "sample_dpdm", "prepare_data"]
    assert g.loc["train_dpdm", "jobs"] == 2 and g.loc["train_dpdm", "wall_s"] == 1100.0
    assert g.loc["train_dpdm", "max_rss_mb"] == 2100.0


def test_a_run_costs_the_sum_of_its_jobs_and_nan_when_one_is_unknown(root):
    df = runtime_frame(root)
    both = job_cost(df, [root / "train_dpdm" / "edm_eps1_seed0.tsv", root / "sample_dpdm" / "edm_eps1_seed0/ddim.tsv"])
    assert both == {"cost_wall_s": 660.0, "cost_cpu_s": 1150.0, "cost_max_rss_mb": 2000.0}
    assert math.isnan(job_cost(df, [root / "train_dpdm" / "missing.tsv"])["cost_wall_s"])
    assert math.isnan(job_cost(df, [])["cost_cpu_s"])


def test_the_stage_writes_the_table_and_the_figure(root, tmp_path):
    runtime_table({}, {"table": tmp_path / "runtime.parquet"}, {"benchmarks": str(root), "config_id": "c"})
    df = pd.read_parquet(tmp_path / "runtime.parquet")
    assert set(df["rule"]) == {"train_dpdm", "sample_dpdm", "prepare_data"}
    runtime_figure({"table": tmp_path / "runtime.parquet"}, {"figure": tmp_path / "runtime.png"}, {})
    assert (tmp_path / "runtime.png").stat().st_size > 0 and (tmp_path / "runtime.pdf").is_file()


def test_the_figure_counts_jobs_in_words_and_names_memory_as_peak_rss(root):
    fig = runtime_figure_of(runtime_frame(root))
    notes = [t.get_text().strip() for t in fig.axes[0].texts]
    assert "2 jobs, peak RSS 2.1 GiB" in notes and "1 job, peak RSS 0.9 GiB" in notes
    assert "1 job, peak RSS not measured" in notes and not any("1 jobs" in n for n in notes)
    assert "(4 jobs," in fig.axes[0].get_title()


def test_no_benchmark_file_and_a_broken_one_are_one_line_errors(tmp_path):
    with pytest.raises(PipelineError, match="no benchmark file under"):
        runtime_table({}, {"table": tmp_path / "t.parquet"}, {"benchmarks": str(tmp_path / "none")})
    (tmp_path / "b" / "rule").mkdir(parents=True)
    (tmp_path / "b" / "rule" / "job.tsv").write_text("wall\n1\n")
    with pytest.raises(PipelineError, match="not a Snakemake benchmark file"):
        runtime_table({}, {"table": tmp_path / "t.parquet"}, {"benchmarks": str(tmp_path / "b")})
