"""Samplers that turn denoisers into images.

* :mod:`.empirical` -- the samplers of the clipped empirical denoiser (EMPDEN Algorithm 1: full batch, output-wise
  subsampled hybrid, per-step resampling) and the public EDM Heun sampler they hand off to, shared by EMPDEN's cells
  (``pipeline/methods/empden/sample_stage.py``) and its diagnostics (``pipeline/methods/empden_diagnostics/``).
* :mod:`.samplers` -- the samplers of any ``dpgen-denoiser/1`` file (deterministic / stochastic DDIM, EDM with
  churn, classifier-free guidance; DPDM App. C and F.4.3 name them), shared by DPDM and the DP-SGD baselines;
  :mod:`.denoiser_stage` -- the stages that sample a denoiser file (``sample_dpdm``, ``dpdm_sample_grid``).

The private parts (the clipped empirical denoiser, its noise and its ledger lines) live in
:mod:`pipeline.privacy.empirical_denoiser`; these samplers only call them and never compute eps.
"""
