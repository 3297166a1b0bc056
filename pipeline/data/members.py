"""Which private records play the *members* of the membership attacks (pipeline/audit/mia_stage.py).

One fixed subset, the same for every model attacked and for DPDM's non-private twin that trains on
it (pipeline/methods/audit/twin.py), drawn from the stream ``audit.mia``.
"""

from __future__ import annotations

import torch

from pipeline import seeds


def member_indices(n_private: int, n: int, seed: int) -> torch.Tensor:
    """``n`` of the ``n_private`` private records (indices into private_train), a function of ``seed`` only."""
    if not 0 < n <= n_private:
        raise ValueError(f"a member subset of {n} records needs 0 < n <= {n_private} (the private records)")
    return torch.randperm(n_private, generator=seeds.torch_generator("audit.mia", seed))[:n]
