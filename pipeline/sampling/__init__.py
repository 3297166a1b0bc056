"""Samplers that turn denoisers into images.

* :mod:`.empden` -- EMPDEN's private samplers (full batch, output-wise subsampled hybrid of
  Algorithm 1, per-step resampling) and the public EDM Heun sampler they hand off to.

The private parts (the clipped empirical denoiser, its noise and its ledger lines) live in
:mod:`pipeline.privacy.empirical_denoiser`; these samplers only call them and never compute eps.
"""
