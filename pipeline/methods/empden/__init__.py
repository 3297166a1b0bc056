"""EMPDEN's sampling grid (EMPDEN Sec. 6, App. J): the cells' samplers, Tables 2, 3, 8/9, 10 and Figures 2, 3, 4 right.

Its own code: the cells and their names (``grid.py``), what a cell releases (``plan.py``), the cell stage
(``sample_stage.py``), the result tables and figures (``results.py``), its wiring, costs, streams, checks and
GPU-check workloads. The samplers are the engine :mod:`pipeline.sampling.empirical`, the mechanism
:mod:`pipeline.privacy.empirical_denoiser`. Rules: ``rules/empden.smk``.
"""

from pipeline.plugins import Method

METHOD = Method("empden", position=3, report_category="3 EMPDEN", report_prefixes=("empden",), audited=True,
                title="EMPDEN",
                streams="pipeline.methods.empden.streams:STREAMS",
                workloads="pipeline.methods.empden.workloads:WORKLOADS",
                config_checks="pipeline.methods.empden.checks:config_checks")

STAGES = {
    "empden_sample": "pipeline.methods.empden.sample_stage:empden_sample",
    "empden_gather": "pipeline.methods.empden.sample_stage:empden_gather",
    "empden_table8_grid": "pipeline.methods.empden.results:empden_table8_grid",
    "empden_table2_comparison": "pipeline.methods.empden.results:empden_table2_comparison",
    "empden_table3_beta": "pipeline.methods.empden.results:empden_table3_beta",
    "empden_table10_seeds": "pipeline.methods.empden.results:empden_table10_seeds",
    "empden_figure3_tradeoffs": "pipeline.methods.empden.results:empden_figure3_tradeoffs",
    "empden_figure4_samples": "pipeline.methods.empden.results:empden_figure4_samples",
    "empden_figure2_trajectories": "pipeline.methods.empden.sample_stage:empden_figure2_trajectories",
}
