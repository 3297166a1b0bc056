"""Denoiser networks: diffusers backbones wrapped in the papers' preconditioning.

* :mod:`.denoiser` -- the ``Preconditioned`` base every configuration is, and the conventions
  (``ve_sigma``, ``rectified_flow_t``) a model file records.
* :mod:`.unet` -- ``UNetSpec`` (a JSON-able architecture) and ``build_unet`` (diffusers ``UNet2DModel``).
* :mod:`.edm` -- EDM preconditioning (Karras et al. 2022, Table 1) around ``UNet2DModel``,
  the EDM training loss and noise-level distribution (DPDM App. C, "EDM" configuration).
* :mod:`.precond` -- VP, VE and v-prediction preconditioning and their losses (DPDM App. C), and
  ``PRECONDITIONERS``, the four configurations by name.
* :mod:`.checkpoint` -- the trained-denoiser file every sampler loads (``dpgen-denoiser/1``).
"""
