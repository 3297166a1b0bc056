"""Audits: the one-run canary audit of every DP-SGD ledger line (Steinke, Nasr & Jagielski 2023).

Rules: ``rules/audit.smk``; code: ``pipeline/audit/``.
"""

STAGES = {
    "audit_one_run": "pipeline.audit.stage:audit_one_run",
}
