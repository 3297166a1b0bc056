"""Diagnostics that explain a method rather than score it.

:mod:`pipeline.diagnostics.empden_proxy` -- EMPDEN Sec. 3.3, Sec. 6.3 and App. F: how far the
(clipped) empirical denoiser is a proxy for the public neural denoiser along the sampling
trajectory (Table 4, Figure 1), what survives to the released sample when one is substituted
for the other inside a window of steps (Tables 1, 5, 6), and where the critical window lies
(Figure 6a). :mod:`pipeline.diagnostics.image_metrics` holds the image-space agreement
metrics and bootstrap intervals those tables use.

These diagnostics read the private set *without* differential privacy (as the paper's do):
their tables describe the method and are not private releases; no ledger line is written.
"""
