"""The baselines' random streams (:mod:`pipeline.seeds`): DP-MERF, its successors (DP-HP, DP-NTK, DP-MEPF: one
family of streams each), Private Evolution and PrivImage.

Declared in the baselines' folder so that :func:`pipeline.seeds.stream` finds them in any process: a bundle of a
successor samples from ``<method>.generator`` in a process that ran no stage. The successors are listed here, not
read from :data:`pipeline.baselines.embedding_family.MECHANISM`, so that finding a stream imports no engine (a test
holds the two lists equal).
"""

from __future__ import annotations

from pipeline.seeds import Stream

#: DP-MERF's successors (pipeline.baselines.embedding_family), each with its own three streams
EMBEDDING_FAMILY = ("dp_hp", "dp_ntk", "dp_mepf")


def _embedding_family_streams(method: str) -> tuple[Stream, ...]:
    return (
        Stream(f"{method}.features", f"{method}'s feature map: public subsets, pixel pairs, random network "
               "(public randomness)"),
        Stream(f"{method}.mechanism_noise", f"the Gaussian noise on {method}'s mean embedding"),
        Stream(f"{method}.generator", f"{method}'s generator initialisation, training draws and samples"),
    )


STREAMS: tuple[Stream, ...] = (
    # DP-MERF (pipeline.baselines.dp_merf)
    Stream("dp_merf.features", "the random Fourier frequencies and the public subset of the median "
           "heuristic (public randomness)"),
    Stream("dp_merf.mechanism_noise", "the Gaussian noise on the mean embedding"),
    Stream("dp_merf.generator", "generator initialisation, training draws and the final samples"),
    # its successors (pipeline.baselines.embedding_family)
    *(s for method in EMBEDDING_FAMILY for s in _embedding_family_streams(method)),
    # Private Evolution (pipeline.baselines.private_evolution)
    Stream("pe.api", "latents and sampler noise of the random and variation APIs (public denoiser)"),
    Stream("pe.mechanism_noise", "the Gaussian noise on the vote histograms"),
    Stream("pe.resample", "the draws of candidates in proportion to the noisy counts (post-processing)"),
    # PrivImage (pipeline.baselines.privimage)
    Stream("privimage.mechanism_noise", "the Gaussian noise on PrivImage's semantic histogram"),
)
