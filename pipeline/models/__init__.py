"""Denoiser networks: diffusers backbones wrapped in the papers' preconditioning.

* :mod:`.edm` -- EDM preconditioning (Karras et al. 2022, Table 1) around ``UNet2DModel``,
  the EDM training loss and noise-level distribution (DPDM App. C, "EDM" configuration).
"""
