"""EMPDEN's sampling grid (EMPDEN Sec. 6, App. J): the cells' samplers, Tables 2, 3, 8/9, 10 and Figures 2, 3, 4 right.

Rules: ``rules/empden.smk``; cells and their names: ``pipeline/sampling/empden_grid.py``.
"""

from pipeline.plugins import Method

METHOD = Method("empden", position=3, report_category="3 EMPDEN", report_prefixes=("empden",), audited=True,
                title="EMPDEN",
                streams="pipeline.methods.empden.streams:STREAMS",
                workloads="pipeline.methods.empden.workloads:WORKLOADS",
                config_checks="pipeline.methods.empden.checks:config_checks")

STAGES = {
    "empden_sample": "pipeline.sampling.empden_stage:empden_sample",
    "empden_gather": "pipeline.sampling.empden_stage:empden_gather",
    "empden_table8_grid": "pipeline.results.empden_results:empden_table8_grid",
    "empden_table2_comparison": "pipeline.results.empden_results:empden_table2_comparison",
    "empden_table3_beta": "pipeline.results.empden_results:empden_table3_beta",
    "empden_table10_seeds": "pipeline.results.empden_results:empden_table10_seeds",
    "empden_figure3_tradeoffs": "pipeline.results.empden_results:empden_figure3_tradeoffs",
    "empden_figure4_samples": "pipeline.results.empden_results:empden_figure4_samples",
    "empden_figure2_trajectories": "pipeline.sampling.empden_stage:empden_figure2_trajectories",
}
