"""EMPDEN's sampling-time accounting (EMPDEN Tables 7, 8/9 eps, 11, 12, 13; Figures 4 left, 5, 7).

Rules: ``rules/account.smk``. The accountants themselves live in ``pipeline/privacy/``.
"""

STAGES = {
    "empden_blocks": "pipeline.accounting.empden:empden_blocks",
    "empden_table7_accountants": "pipeline.accounting.empden:empden_table7_accountants",
    "empden_table8_9_eps": "pipeline.accounting.empden:empden_table8_9_eps",
    "empden_table11_edgeworth_clt_pld": "pipeline.accounting.empden:empden_table11_edgeworth_clt_pld",
    "empden_table12_rdp": "pipeline.accounting.empden:empden_table12_rdp",
    "empden_table13_theoretical_asr": "pipeline.accounting.empden:empden_table13_theoretical_asr",
    "empden_figure4_full_batch": "pipeline.accounting.figures:empden_figure4_full_batch",
    "empden_figure5_mu_vs_logsnr": "pipeline.accounting.figures:empden_figure5_mu_vs_logsnr",
    "empden_figure7_stopping_traces": "pipeline.accounting.figures:empden_figure7_stopping_traces",
}
