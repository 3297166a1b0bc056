# The reviewer's report: `snakemake --report results/report.html` (make report) after a finished run.
# Its first page is the summary (rule index_html: replay verdict, privacy-utility plot, one headline row per
# method; report/workflow.rst includes it); every figure is flagged where its rule writes it
# (rules/common.smk: report_figure); every table gets a readable view here. Captions: report/captions/.
# Code: pipeline/reporting/review.py. Included last: the table list is every method's registered tables.


rule report_tables:
    """A readable HTML view of every table of `all` (grouped columns, 4 digits, long strings as codes)."""
    input:
        **{name: TABLES / f"{name}.parquet" for name in report_table_views()},
    output:
        **{name: report(view, caption=caption_path(name, "table"), category=report_category(name),
                        subcategory="tables")
           for name, view in report_table_views().items()},
    params:
        ins=io_args("--in", {name: TABLES / f"{name}.parquet" for name in report_table_views()}),
        out=REPORT_DIR / "tables",
    benchmark:
        benchmark_path("report_tables")
    log:
        LOGS / "report_tables.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline report_tables {params.ins} --out dir={params.out:q} --log {log:q}"
