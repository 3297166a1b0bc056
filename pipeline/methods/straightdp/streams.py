"""STRAIGHTDP's random streams (:mod:`pipeline.seeds`): its public data, flow and autoencoder, the moment release,
Stage 2's DP-SGD, sampling, the toy of its figures and Table 4's text-conditional release.

Declared in STRAIGHTDP's folder so that :func:`pipeline.seeds.stream` finds every one of them in any process: a
stage drawing from ``straightdp.public`` need not import the flow engine first. All are SeedSequence streams keyed
by their purpose (none had a derivation before the seed scheme), so a purpose's name is its derivation and none may
be renamed.
"""

from __future__ import annotations

from pipeline.seeds import Stream

STREAMS: tuple[Stream, ...] = (
    # the flow and its stages (pipeline.methods.straightdp.stages)
    Stream("straightdp.public", "the public split of STRAIGHTDP (data stage prepare_public)"),
    Stream("straightdp.horizon", "probes and flow noise of Fig. 2a's cosine curve (public)"),
    Stream("straightdp.pretrain_init", "the public flow's initialisation (torch's global RNG)"),
    Stream("straightdp.pretrain", "batches, times, flow noise and label dropout of public pretraining"),
    Stream("straightdp.lora_init", "the DP-LoRA adapters' initialisation (torch's global RNG, as peft draws it)"),
    Stream("straightdp.release", "the Gaussian noise of the moment release (Stage 1)"),
    Stream("straightdp.distill", "draws of the distillation onto the released field (post-processing)"),
    Stream("straightdp.proxy", "public examples, times and noise of the THA planner's proxy"),
    Stream("straightdp.draws", "Poisson sampling, time/noise draws and label dropout of DP-SGD"),
    Stream("straightdp.mechanism_noise", "the Gaussian mechanism's noise of Stage 2 DP-SGD"),
    Stream("straightdp.sampling", "labels order, starts and draws of a sample set"),
    # the public autoencoder of the latent variant (pipeline.flow.autoencoder)
    Stream("straightdp.autoencoder_init", "the public autoencoder's initialisation (torch's global RNG)"),
    Stream("straightdp.autoencoder", "batches of the public autoencoder's training"),
    # the 2-D toy (pipeline.methods.straightdp.toy)
    Stream("straightdp.toy_public", "the toy's public set: the mixture rotated by half a mode spacing"),
    Stream("straightdp.toy_truth", "fresh draws of the true toy mixture that W2 is measured against"),
    Stream("straightdp.toy_init", "the toy velocity MLP's initialisation (torch's global RNG)"),
    # Table 4's text-conditional release (pipeline.methods.straightdp.table4)
    Stream("straightdp.compose", "the quadrant and thickness of each composed image (keys: 0 private, "
                                 "1 public, 2 held-out evaluation)"),
    Stream("straightdp.text_release", "the Gaussian noise of the text-conditional release (Table 4)"),
    Stream("straightdp.text_sampling", "draws of the released text-conditional model (Table 4)"),
)
