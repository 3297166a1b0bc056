"""Diagnostics that explain a method rather than score it: the classifiers the diagnostics score images with
(:mod:`.classifiers`: the evaluation net, zero-shot CLIP) and the image-space agreement metrics and bootstrap
intervals (:mod:`.image_metrics`).

EMPDEN's proxy diagnostics (Sec. 3.3, Sec. 6.3, App. F), which stand on them, are their method's own code:
``pipeline/methods/empden_diagnostics/proxy.py``. They read the private set *without* differential privacy (as the
paper's do): their tables describe the method and are not private releases; no ledger line is written.
"""
