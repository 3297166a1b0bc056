"""EMPDEN's proxy diagnostics (EMPDEN Sec. 3.3, 6.3, App. F; Tables 1, 4, 5, 6; Figures 1, 6a): non-private, flagged.

Its stages: ``proxy.py``. Rules: ``rules/empden_diagnostics.smk``.
"""

from pipeline.plugins import Method

# EMPDEN's: its tables are empden_*
METHOD = Method("empden_diagnostics", position=4,
                input_checks="pipeline.methods.empden_diagnostics.checks:input_checks",
                streams="pipeline.methods.empden_diagnostics.streams:STREAMS")

STAGES = {
    "empden_table4_proxy": "pipeline.methods.empden_diagnostics.proxy:empden_table4_proxy",
    "empden_table1_window_swap": "pipeline.methods.empden_diagnostics.proxy:empden_table1_window_swap",
    "empden_figure6_critical_window": "pipeline.methods.empden_diagnostics.proxy:empden_figure6_critical_window",
}
