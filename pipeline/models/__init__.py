"""Denoiser networks: diffusers backbones wrapped in the papers' preconditioning.

* :mod:`.unet` -- ``UNetSpec`` (a JSON-able architecture) and ``build_unet`` (diffusers ``UNet2DModel``).
* :mod:`.edm` -- EDM preconditioning (Karras et al. 2022, Table 1) around ``UNet2DModel``,
  the EDM training loss and noise-level distribution (DPDM App. C, "EDM" configuration).
* :mod:`.precond` -- VP, VE and v-prediction preconditioning and their losses (DPDM App. C).
* :mod:`.checkpoint` -- the trained-denoiser file every sampler loads (``dpgen-denoiser/1``).
"""
