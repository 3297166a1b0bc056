"""Audits: the one-run canary audit of every DP-SGD ledger line (Steinke, Nasr & Jagielski 2023), and
membership inference (loss and SecMI attacks) on every trained model and DPDM's non-private twin.

Rules: ``rules/audit.smk``; code: ``pipeline/audit/`` and ``pipeline/methods/audit/twin.py``.
"""

from pipeline.plugins import Method

METHOD = Method("audit", position=8, report_category="8 Audits", report_prefixes=("audit",),
                resumable_rules=("train_dpdm_twin",),
                streams="pipeline.methods.audit.streams:STREAMS")

STAGES = {
    "audit_one_run": "pipeline.audit.stage:audit_one_run",
    "train_dpdm_twin": "pipeline.methods.audit.twin:train_dpdm_twin",
    "audit_mia": "pipeline.audit.mia_stage:audit_mia",
    "audit_mia_table": "pipeline.audit.mia_stage:audit_mia_table",
    "empden_table13": "pipeline.audit.mia_stage:empden_table13",
}
