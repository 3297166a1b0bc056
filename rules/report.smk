# Reporting: Parquet tables (results/tables/), figures (results/figures/), the summary page (results/index.html,
# the first page of `snakemake --report`), and the cross-method comparison (all_runs.parquet + privacy_utility.png).
# Code: pipeline/reporting/stage.py, pipeline/reporting/review.py (the summary), pipeline/results/all_runs.py.
# Resources: pipeline/resources.py HOUSE_REQUESTS.


rule reference_real:
    """Table reference_real: metrics of held-out real data against the real test split."""
    input:
        reference_real=OUTPUTS.reference_metrics,
    output:
        table=TABLES / "reference_real.parquet",
    params:
        p=stage_params(
            seed=SEED,
            rows={"reference_real": {"experiment": EXP, "method": "real held-out data (no privacy)"}},
        ),
    benchmark:
        benchmark_path("reference_real")
    log:
        LOGS / "table_reference_real.log",
    threads: 1
    resources: **HOUSE.resources("reference_real")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline collect_table --in reference_real={input.reference_real:q}"
        " --out table={output.table:q} --params {params.p:q} --log {log:q}"


rule data_samples:
    """Figure data_samples: example images of every split and the toy mixture."""
    input:
        **{k: v for k, v in data_splits().items() if k not in ("eval_train", "reference", "val")},
    output:
        png=report_figure("data_samples"),
        pdf=FIGURES / "data_samples.pdf",
    params:
        ins=io_args("--in", {k: v for k, v in data_splits().items() if k not in ("eval_train", "reference", "val")}),
    benchmark:
        benchmark_path("data_samples")
    log:
        LOGS / "figure_data_samples.log",
    threads: 1
    resources: **HOUSE.resources("data_samples")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline data_figure {params.ins} --out figure={output.png:q} --log {log:q}"


rule index_html:
    """results/index.html and the report's first page: replay verdict, privacy-utility plot, one row per method."""
    input:
        replay=REPLAY_REPORT,
        all_runs=TABLES / "all_runs.parquet",
        figure=FIGURES / "privacy_utility.png",
    output:
        index=RESULTS / "index.html",
        fragment=REPORT_DIR / "summary.html",
    params:
        # the files Snakemake merged (config.yaml first) and the --config keys: the page says what was run
        p=OUTPUTS.index_params(configfiles=workflow.configfiles,
                               overrides=list(workflow.config_settings.overwrite_config)),
    benchmark:
        benchmark_path("index_html")
    log:
        LOGS / "index_html.log",
    threads: 1
    resources: **HOUSE.resources("index_html")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline index_html --in replay={input.replay:q} all_runs={input.all_runs:q}"
        " figure={input.figure:q} --out index={output.index:q} fragment={output.fragment:q} --params {params.p:q}"
        " --log {log:q}"


rule all_runs_table:
    """Table all_runs: one row per evaluated (method, configuration, seed), certified eps from its transcripts."""
    input:
        unpack(lambda wildcards: {**run_table_inputs(OUTPUTS.all_run_records()), **AUDIT.all_runs_inputs(),
                                  "runtime": TABLES / "runtime.parquet"}),
    output:
        table=TABLES / "all_runs.parquet",
    params:
        p=lambda wildcards: run_table_params(OUTPUTS.all_run_records()),
        ins=lambda wildcards: io_args("--in", {**run_table_inputs(OUTPUTS.all_run_records()), **AUDIT.all_runs_inputs(),
                                               "runtime": TABLES / "runtime.parquet"}),
    benchmark:
        benchmark_path("all_runs_table")
    log:
        LOGS / "all_runs_table.log",
    threads: 1
    resources: **HOUSE.resources("all_runs_table")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline all_runs_table {params.ins} --out table={output.table:q} --params {params.p:q} --log {log:q}"


rule privacy_utility_figure:
    """Figure privacy_utility: downstream accuracy and FID vs certified eps, one line per method, references flat."""
    input:
        table=TABLES / "all_runs.parquet",
    output:
        png=report_figure("privacy_utility"),
        pdf=FIGURES / "privacy_utility.pdf",
    benchmark:
        benchmark_path("privacy_utility_figure")
    log:
        LOGS / "privacy_utility_figure.log",
    threads: 1
    resources: **HOUSE.resources("privacy_utility_figure")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline privacy_utility_figure --in table={input.table:q} --out figure={output.png:q} --log {log:q}"


rule runtime_table:
    """Table runtime: one row per job (rule, wildcards, wall s, CPU s, max RSS MB) from every benchmark file,
    built after every other job of `all` (the bundles' included) but the comparison and the index page (they read
    it)."""
    input:
        lambda wildcards: OUTPUTS.before_runtime(),
        replay=REPLAY_REPORT,
    output:
        table=TABLES / "runtime.parquet",
    params:
        p=stage_params(benchmarks=str(BENCHMARKS), seed=SEED),
    benchmark:
        benchmark_path("runtime_table")
    log:
        LOGS / "runtime_table.log",
    threads: 1
    resources: **HOUSE.resources("runtime_table")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline runtime_table --out table={output.table:q} --params {params.p:q} --log {log:q}"


rule runtime_figure:
    """Figure runtime: the rules that cost the most job time (wall and CPU minutes, jobs, peak RSS)."""
    input:
        table=TABLES / "runtime.parquet",
    output:
        png=report_figure("runtime"),
        pdf=FIGURES / "runtime.pdf",
    benchmark:
        benchmark_path("runtime_figure")
    log:
        LOGS / "runtime_figure.log",
    threads: 1
    resources: **HOUSE.resources("runtime_figure")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline runtime_figure --in table={input.table:q} --out figure={output.png:q} --log {log:q}"
