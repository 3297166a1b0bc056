# The reviewer's report: `snakemake --report results/report.html` (make report) after a finished run.
# Its first page is the summary (rule index_html: replay verdict, privacy-utility plot, one headline row per
# method; report/workflow.rst includes it); every figure is flagged where its rule writes it
# (rules/common.smk: report_figure); every table gets a readable view here. Captions: report/captions/.
# Code: pipeline/reporting/review.py. Resources: pipeline/resources.py HOUSE_REQUESTS.


rule report_tables:
    """A readable HTML view of every table of `all` (caption above, key columns first, 4 digits, text in full)."""
    input:
        # a function: a method's rule file may register its tables after this file is read
        unpack(lambda wildcards: OUTPUTS.report_view_inputs()),
    output:
        # one directory whose files are the results: the table list is known only once every rule file is read
        views=report(directory(REPORT_DIR / "tables"), patterns=["{name}.html"],
                     caption=str(CAPTIONS / "_table.rst"), category=lambda wildcards: OUTPUTS.report_category(wildcards.name),
                     subcategory="tables"),
    params:
        ins=lambda wildcards: io_args("--in", OUTPUTS.report_view_inputs()),
        # the captions' text, read by report/captions/_table.rst when `snakemake --report` renders each view
        captions=lambda wildcards: OUTPUTS.table_captions(),
    benchmark:
        benchmark_path("report_tables")
    log:
        LOGS / "report_tables.log",
    threads: 1
    resources: **HOUSE.resources("report_tables")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline report_tables {params.ins} --out dir={output.views:q} --log {log:q}"
