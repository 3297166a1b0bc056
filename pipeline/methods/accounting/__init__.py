"""EMPDEN's sampling-time accounting (EMPDEN Tables 7, 8/9 eps, 11, 12, 13; Figures 4 left, 5, 7).

Rules: ``rules/account.smk``. The accountants themselves live in ``pipeline/privacy/``.
"""

from pipeline.plugins import Method

# its tables are EMPDEN's: empden_*, in EMPDEN's report category
METHOD = Method("accounting", position=1, config_checks="pipeline.methods.accounting.checks:config_checks")

STAGES = {
    "empden_blocks": "pipeline.results.empden_accounting:empden_blocks",
    "empden_table7_accountants": "pipeline.results.empden_accounting:empden_table7_accountants",
    "empden_table8_9_eps": "pipeline.results.empden_accounting:empden_table8_9_eps",
    "empden_table11_edgeworth_clt_pld": "pipeline.results.empden_accounting:empden_table11_edgeworth_clt_pld",
    "empden_table12_rdp": "pipeline.results.empden_accounting:empden_table12_rdp",
    "empden_table13_theoretical_asr": "pipeline.results.empden_accounting:empden_table13_theoretical_asr",
    "empden_figure4_full_batch": "pipeline.results.empden_accounting_figures:empden_figure4_full_batch",
    "empden_figure5_mu_vs_logsnr": "pipeline.results.empden_accounting_figures:empden_figure5_mu_vs_logsnr",
    "empden_figure7_stopping_traces": "pipeline.results.empden_accounting_figures:empden_figure7_stopping_traces",
}
