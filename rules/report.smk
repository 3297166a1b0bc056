# Reporting: Parquet tables (results/tables/), figures (results/figures/), index page.
# Code: pipeline/reporting/stage.py.


rule reference_real:
    """Table reference_real: metrics of held-out real data against the real test split."""
    input:
        reference_real=EXPDIR / "eval" / "reference_real" / "metrics.json",
    output:
        table=TABLES / "reference_real.parquet",
    params:
        p=stage_params(
            seed=SEED,
            rows={"reference_real": {"experiment": EXP, "method": "real held-out data (no privacy)"}},
        ),
    log:
        LOGS / "table_reference_real.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
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
        png=FIGURES / "data_samples.png",
        pdf=FIGURES / "data_samples.pdf",
    params:
        ins=io_args("--in", {k: v for k, v in data_splits().items() if k not in ("eval_train", "reference", "val")}),
    log:
        LOGS / "figure_data_samples.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline data_figure {params.ins} --out figure={output.png:q} --log {log:q}"


rule index_html:
    """results/index.html: the ledger replay verdict, then every table and figure of rule all."""
    input:
        # functions: methods register their tables in rule files included after this one
        lambda wildcards: report_inputs(),
        replay=REPLAY_REPORT,
    output:
        RESULTS / "index.html",
    params:
        ins=lambda wildcards: io_args("--in", {**{f"{Path(p).stem}_{Path(p).suffix[1:]}": p for p in report_inputs()},
                                               "replay": REPLAY_REPORT}),
        p=params_json(title=f"DP generative models: {EXP}"),
    log:
        LOGS / "index_html.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline index_html {params.ins} --out index={output:q} --params {params.p:q} --log {log:q}"
