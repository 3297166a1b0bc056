"""EMPDEN's sampling-time accounting (EMPDEN Tables 7, 8/9 eps, 11, 12, 13; Figures 4 left, 5, 7).

Its stages: ``blocks.py`` (``empden_blocks`` and the tables), ``figures.py``; its wiring, costs and checks beside
them. Rules: ``rules/account.smk``. The accountants themselves live in ``pipeline/privacy/``.
"""

from pipeline.plugins import Method

# its tables are EMPDEN's: empden_*, in EMPDEN's report category
METHOD = Method("accounting", position=1, config_checks="pipeline.methods.accounting.checks:config_checks")

STAGES = {
    "empden_blocks": "pipeline.methods.accounting.blocks:empden_blocks",
    "empden_table7_accountants": "pipeline.methods.accounting.blocks:empden_table7_accountants",
    "empden_table8_9_eps": "pipeline.methods.accounting.blocks:empden_table8_9_eps",
    "empden_table11_edgeworth_clt_pld": "pipeline.methods.accounting.blocks:empden_table11_edgeworth_clt_pld",
    "empden_table12_rdp": "pipeline.methods.accounting.blocks:empden_table12_rdp",
    "empden_table13_theoretical_asr": "pipeline.methods.accounting.blocks:empden_table13_theoretical_asr",
    "empden_figure4_full_batch": "pipeline.methods.accounting.figures:empden_figure4_full_batch",
    "empden_figure5_mu_vs_logsnr": "pipeline.methods.accounting.figures:empden_figure5_mu_vs_logsnr",
    "empden_figure7_stopping_traces": "pipeline.methods.accounting.figures:empden_figure7_stopping_traces",
}
