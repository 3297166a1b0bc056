"""DPDM's random streams (:mod:`pipeline.seeds`): its DP-SGD training and sampling, the gradient-variance diagnostic
of its Fig. 3, and the DP-SGD classifier of its task-specific evaluation.

Declared here, in DPDM's folder, so that :func:`pipeline.seeds.stream` finds them in any process (one that only
samples a bundle runs no stage); the purposes, documents and derivations are the ones every released table was
drawn with, so none may change.
"""

from __future__ import annotations

from pipeline.seeds import Stream

STREAMS: tuple[Stream, ...] = (
    # DPDM DP-SGD training (pipeline.training.dp_denoiser)
    Stream("dpdm.init", "network initialisation (torch and NumPy global RNGs)", lambda seed: seed),
    Stream("dpdm.draws", "Poisson sampling, diffusion (sigma, noise) draws, label dropout", lambda seed: seed + 1),
    Stream("dpdm.mechanism_noise", "the Gaussian mechanism's noise on the clipped gradient sum",
           lambda seed: seed + 2),
    # DPDM sampling (pipeline.sampling.samplers.generate)
    Stream("dpdm.sampling", "latents and sampler noise, in batch order", lambda seed: seed),
    # the gradient variance of Fig. 3 (pipeline.methods.dpdm.gradient_variance)
    Stream("dpdm.gradient_variance.draws", "the (sigma, noise) draws of one image and K (keys: image, K)"),
    Stream("dpdm.gradient_variance.resample", "the public images chosen and the bootstrap resamples"),
    # the DP-SGD classifier of the task-specific evaluation (pipeline.methods.dpdm.dpsgd_classifier)
    Stream("dpsgd_classifier.init", "the classifier's initialisation and its dropout (torch's global RNG)"),
    Stream("dpsgd_classifier.draws", "Poisson sampling of each DP-SGD step"),
    Stream("dpsgd_classifier.mechanism_noise", "the Gaussian mechanism's noise on the clipped gradient sum"),
)
