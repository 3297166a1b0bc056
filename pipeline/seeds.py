"""One seed scheme: every random stream of the pipeline, named by its purpose, derived here.

A run has one integer ``seed`` (the config's); each use of randomness is a *stream* with a
purpose name (``"pretrain.draws"``, ``"data.public"``, ...) and gets its generator from
:func:`torch_generator` or :func:`numpy_rng`. Streams of different purposes are independent, so
adding a stream (or drawing more from one) never moves another stream's numbers.

New purposes derive their entropy with NumPy's ``SeedSequence`` keyed by the purpose:
``SeedSequence([seed, purpose_key(purpose), *keys])`` (the SeedSequence design: distinct entropy
words give statistically independent streams; O'Neill 2018 / NumPy NEP 19). Purposes that
existed before this module keep their **legacy derivation** (``seed + 1``, ``seed * 1_000_003 +
epoch``, ...) recorded with the stream: every released table was drawn with them, and a new
derivation would change every number. A purpose declared nowhere is an error, so a typo cannot
silently open a fresh stream.

The house's own streams are :data:`STREAMS`; a method declares its own in its folder
(``pipeline/methods/<method>/streams.py``, named by :attr:`pipeline.plugins.Method.streams`), and
:func:`stream` finds them through :mod:`pipeline.plugins` by module path: a caller imports no stage
module for its stream to exist (a process that only samples a bundle runs no stage), and this module
keeps no list of methods.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from pipeline import plugins

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


#: the house's streams (a method's are its own: :func:`method_streams`). ``legacy`` entries reproduce the
#: derivation each call site used before this module existed (the numbers of every released table depend on them).
STREAMS: dict[str, Stream] = _streams(
    # public EDM pretraining (pipeline.training.pretrain)
    Stream("pretrain.init", "network initialisation (torch and NumPy global RNGs)", lambda seed: seed),
    Stream("pretrain.draws", "sigma, noise and label-dropout draws of each step", lambda seed: seed + 1),
    Stream("pretrain.batches", "the permutation of epoch `epoch` (key: epoch)",
           lambda seed, epoch: seed * 1_000_003 + epoch),
    Stream("pretrain.fixed_draws", "the fixed (sigma, noise) draws of the comparable loss (key: its fixed seed)",
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
    Stream("clip.train", "the small CLIP's initialisation and its per-class batches (keys: none)"),
)


@cache
def method_streams() -> dict[str, Stream]:
    """Every method's declared streams (:attr:`pipeline.plugins.Method.streams`), loaded once (each method's
    module by its path: :func:`pipeline.plugins.resolve`).

    A purpose declared twice, by the house and a method or by two methods, must be the same stream: two
    meanings of one name would draw the same numbers for two uses, and one of them would silently move
    when the other changed.
    """
    found: dict[str, Stream] = {}
    owner = {purpose: "the house" for purpose in STREAMS}
    for name, method in plugins.methods().items():
        if method.streams is None:
            continue
        for s in plugins.resolve(method.streams):
            known = STREAMS.get(s.purpose) or found.get(s.purpose)
            if known is not None and known != s:
                raise ValueError(f"random stream {s.purpose!r} of method {name!r} is already declared differently "
                                 f"by {owner[s.purpose]}")
            found[s.purpose] = s
            owner.setdefault(s.purpose, f"method {name!r}")
    return found


def all_streams() -> dict[str, Stream]:
    """The house's streams and every method's, by purpose."""
    return {**STREAMS, **method_streams()}


def stream(purpose: str) -> Stream:
    """The stream of ``purpose``: the house's, else the method's that declares it."""
    found = STREAMS.get(purpose) or method_streams().get(purpose)
    if found is None:
        raise KeyError(f"unknown random stream {purpose!r}: add it to pipeline.seeds.STREAMS (the house's) or to "
                       "its method's streams (pipeline/methods/<method>/streams.py)")
    return found


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
