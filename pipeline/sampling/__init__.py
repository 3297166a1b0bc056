"""Samplers that turn denoisers into images.

* :mod:`.empden` -- EMPDEN's private samplers (full batch, output-wise subsampled hybrid of
  Algorithm 1, per-step resampling) and the public EDM Heun sampler they hand off to;
  :mod:`.empden_stage` / :mod:`.empden_grid` -- one grid cell as a DAG stage and its path names (a cell over
  several jobs: :mod:`pipeline.shards`); :mod:`.empden_plan` -- what a cell's run releases, from the configuration
  alone (torch-free: the stage runs it, the wiring registers it for the replay).
* :mod:`.samplers` -- the samplers of any ``dpgen-denoiser/1`` file (deterministic / stochastic DDIM, EDM with
  churn, classifier-free guidance; DPDM App. C and F.4.3 name them), shared by DPDM and the DP-SGD baselines;
  :mod:`.denoiser_stage` -- the stages that sample a denoiser file (``sample_dpdm``, ``dpdm_sample_grid``).

The private parts (the clipped empirical denoiser, its noise and its ledger lines) live in
:mod:`pipeline.privacy.empirical_denoiser`; these samplers only call them and never compute eps.
"""
