"""One seed scheme: every random stream of the pipeline, named by its purpose, derived here.

A run has one integer ``seed`` (the config's); each use of randomness is a *stream* with a
purpose name (``"dpdm.mechanism_noise"``, ``"pretrain.batches"``, ...) and gets its generator from
:func:`torch_generator` or :func:`numpy_rng`. Streams of different purposes are independent, so
adding a stream (or drawing more from one) never moves another stream's numbers.

New purposes derive their entropy with NumPy's ``SeedSequence`` keyed by the purpose:
``SeedSequence([seed, purpose_key(purpose), *keys])`` (the SeedSequence design: distinct entropy
words give statistically independent streams; O'Neill 2018 / NumPy NEP 19). Purposes that
existed before this module keep their **legacy derivation** (``seed + 1``, ``seed * 1_000_003 +
epoch``, ...) recorded in :data:`STREAMS`: every released table was drawn with them, and a new
derivation would change every number. A purpose not listed here is an error, so a typo cannot
silently open a fresh stream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

#: a derivation: (seed, *keys) -> an int seed, or a list of ints (SeedSequence entropy)
Derivation = Callable[..., "int | list[int]"]


@dataclass(frozen=True)
class Stream:
    """One purpose: how its entropy derives from the run's seed (and extra keys such as an epoch)."""

    purpose: str
    doc: str
    legacy: Derivation | None = None  # None: SeedSequence([seed, purpose_key(purpose), *keys])

    def entropy(self, seed: int, *keys: int) -> int | list[int]:
        if self.legacy is not None:
            return self.legacy(int(seed), *(int(k) for k in keys))
        return [int(seed), purpose_key(self.purpose), *(int(k) for k in keys)]


def purpose_key(purpose: str) -> int:
    """A stable 32-bit word for a purpose name (the first 4 bytes of its SHA-256): its SeedSequence key."""
    return int.from_bytes(hashlib.sha256(purpose.encode()).digest()[:4], "little")


def _streams(*streams: Stream) -> dict[str, Stream]:
    return {s.purpose: s for s in streams}


#: every stream of the pipeline. ``legacy`` entries reproduce the derivation each call site used
#: before this module existed (the numbers of every released table depend on them).
STREAMS: dict[str, Stream] = _streams(
    # public EDM pretraining (pipeline.training.pretrain)
    Stream("pretrain.init", "network initialisation (torch and NumPy global RNGs)", lambda seed: seed),
    Stream("pretrain.draws", "sigma, noise and label-dropout draws of each step", lambda seed: seed + 1),
    Stream("pretrain.batches", "the permutation of epoch `epoch` (key: epoch)",
           lambda seed, epoch: seed * 1_000_003 + epoch),
    Stream("pretrain.fixed_draws", "the fixed (sigma, noise) draws of the comparable loss (key: its fixed seed)",
           lambda seed: seed),
    # DPDM DP-SGD training (pipeline.training.dpdm)
    Stream("dpdm.init", "network initialisation (torch and NumPy global RNGs)", lambda seed: seed),
    Stream("dpdm.draws", "Poisson sampling, diffusion (sigma, noise) draws, label dropout", lambda seed: seed + 1),
    Stream("dpdm.mechanism_noise", "the Gaussian mechanism's noise on the clipped gradient sum",
           lambda seed: seed + 2),
    # DPDM sampling (pipeline.sampling.dpdm.generate)
    Stream("dpdm.sampling", "latents and sampler noise, in batch order", lambda seed: seed),
    # EMPDEN sampling (pipeline.sampling.empden_stage)
    Stream("empden.chunk", "initial states, subsets, mechanism and re-noising noise of one batch of a cell "
           "(key: the batch's index in the cell's run; pipeline.shards)"),
    Stream("empden.normaliser_subset", "the fixed public subset of the public-marginal normaliser "
           "(a constant: every cell divides by the same Z)", lambda seed: 0),
    Stream("empden.figure2", "x_T of Figure 2's trajectories (each scheme starts from the same states)",
           lambda seed: seed),
    # the data stage (pipeline.data.stage): one stream per split family
    Stream("data.real_splits", "the stratified private / held-out split of the real images", lambda seed: seed),
    Stream("data.public", "the public split: draw, carve-out, typesetting of printed digits", lambda seed: seed + 1),
    Stream("data.toy", "the 2-D Gaussian-mixture toy", lambda seed: seed + 2),
    # evaluation (pipeline.evaluation)
    Stream("evalnet.init", "the evaluation net's initialisation (torch's global RNG)", lambda seed: seed),
    Stream("evalnet.batches", "the evaluation net's batch order", lambda seed: seed),
    Stream("downstream.classifier", "downstream classifier number `repeat` (key: repeat)",
           lambda seed, repeat: seed + repeat),
    Stream("diagnostics.bootstrap", "BCa bootstrap resamples of the diagnostics' intervals", lambda seed: seed),
    # EMPDEN proxy diagnostics (pipeline.diagnostics.empden_proxy): already SeedSequence streams
    Stream("empden_proxy.start", "x_T of a trajectory batch (keys: batch keys)", lambda seed, *k: [seed, *k, 1]),
    Stream("empden_proxy.steps", "the N step noises of a batch (keys: batch keys)", lambda seed, *k: [seed, *k, 2]),
    Stream("empden_proxy.redraw", "re-drawn step noise of a window (keys: chunk, window)",
           lambda seed, *k: [seed, 3, *k]),
    Stream("empden_proxy.subset", "the B-subsets of a chunk (key: chunk)", lambda seed, *k: [seed, 4, *k]),
    # SENSGEO result stages (pipeline.results.sensgeo): one stream per output, keyed by a salt
    Stream("sensgeo.output", "one table/figure's draws (key: the output's salt)", lambda seed, salt: [seed, salt]),
)


def register_streams(*streams: Stream) -> None:
    """Add a method's streams (its stage module calls this at import); a purpose registered twice
    with another derivation is refused, so two methods cannot share a stream by accident."""
    for s in streams:
        if STREAMS.get(s.purpose, s) != s:
            raise ValueError(f"random stream {s.purpose!r} is already registered differently")
        STREAMS[s.purpose] = s


def stream(purpose: str) -> Stream:
    try:
        return STREAMS[purpose]
    except KeyError:
        raise KeyError(f"unknown random stream {purpose!r}: add it to pipeline.seeds.STREAMS "
                       "(or register_streams in its method's module)") from None


def seed_of(purpose: str, seed: int, *keys: int) -> int:
    """The integer seed of stream ``purpose`` (for ``torch.manual_seed`` / ``np.random.seed``).

    A SeedSequence entropy list is mixed to one non-negative 63-bit integer (``generate_state``).
    """
    entropy = stream(purpose).entropy(seed, *keys)
    if isinstance(entropy, int):
        return entropy
    return mix(entropy)


def mix(entropy: Sequence[int]) -> int:
    """SeedSequence(entropy) as one non-negative int < 2^63 (a valid ``torch.manual_seed``)."""
    state = np.random.SeedSequence([int(k) for k in entropy]).generate_state(1, dtype=np.uint64)[0]
    return int(state >> np.uint64(1))


def torch_generator(purpose: str, seed: int, *keys: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded for stream ``purpose``."""
    return torch.Generator(device=device).manual_seed(seed_of(purpose, seed, *keys))


def numpy_rng(purpose: str, seed: int, *keys: int) -> np.random.Generator:
    """A NumPy ``Generator`` for stream ``purpose`` (``default_rng`` of its entropy: int or SeedSequence list)."""
    return np.random.default_rng(stream(purpose).entropy(seed, *keys))


def seed_globals(purpose: str, seed: int) -> None:
    """Seed torch's and NumPy's global RNGs (what network initialisation draws from) for ``purpose``."""
    s = seed_of(purpose, seed)
    torch.manual_seed(s)
    np.random.seed(s % 2 ** 32)
