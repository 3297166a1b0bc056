"""Audits: experiments that would catch the code not being the mechanism its ledger line declares.

``one_run``: attack statistics (the one-run eps lower bound, TPR at FPR, AUROC) from canary
scores; ``dpsgd_canaries``: the white-box canary audit of the DP-SGD engine; ``stage``: the
DAG stage ``audit_one_run``. Audits read mechanisms from :mod:`pipeline.privacy`; the privacy
package imports nothing from here.
"""
