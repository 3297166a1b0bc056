"""STRAIGHTDP Figure 6: the two-dimensional Gaussian-mixture control, the whole pipeline end to end.

App. D, "End-to-end control": "A two-dimensional Gaussian-mixture instance of the full pipeline
runs in minutes ... Figure 6 sweeps the budget on it" (empirical W2 to the true distribution vs
eps, mean +- s.d. over up to 3 seeds; lines "moments only (GMM)", "uniform DP-SGD", "StraightDP").
Here each line is a Table 1 row run by the same functions as the image pipeline, on points:

* the private set is ``data.toy`` (8 isotropic modes on the unit circle, labelled by mode);
* the public set is the same mixture rotated by half a mode spacing (:data:`PUBLIC_ROTATION`):
  a wrong domain whose label slots mean other modes, as KMNIST's do for MNIST;
* ``released_only`` ("moments only (GMM)"): Stage 1's class-conditional release
  (:func:`pipeline.methods.straightdp.stages.release_class_moments`, Prop. B.9) at the whole eps, sampled
  as N(mu_y, Sigma);
* ``uniform``: the public-pretrained velocity MLP trained by uniform DP-SGD on eq. 1
  (:func:`pipeline.methods.straightdp.stages.dpsgd_flow_training`) at the whole eps;
* ``tha_moments`` ("StraightDP"): the release at its share of eps, distillation onto the
  released field for t < tau (tau from the public cosine knee, :func:`public_horizon`), then the
  THA plan chosen by the public gradient proxy, composed with the release in one PLD accountant;
* ``public_only`` (reference, no private data): the public flow's unconditional samples.

W2 is the exact 2-Wasserstein distance between ``n_eval`` samples and ``n_eval`` fresh draws of
the true mixture (:func:`w2_empirical`). Every mechanism writes its ledger line (one transcript
for the whole figure) and the certified eps of each point is recomputed by the accountant.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from pipeline import seeds
from pipeline.data.embedded import gaussian_mixture_2d
from pipeline.flow.backbone import MLPVelocity
from pipeline.flow.field import GaussianMomentModel
from pipeline.methods.straightdp.stages import (balanced_labels, dpsgd_flow_training, field_of, flow_samples,
                                      public_bucket_gradients, public_horizon, release_class_moments, stage2_plan)
from pipeline.flow.train import distill_to_field, pretrain_flow
from pipeline.privacy import accountants as acc
from pipeline.privacy import dpsgd, ledger, moments, tha
# toy_sgd: the toy's DP-SGD settings, torch-free beside the rows (the wiring registers the lines from both)
from pipeline.methods.straightdp.runs import TOY_RELEASE_P, TOY_ROWS, StraightRun, toy_sgd

log = logging.getLogger(__name__)


#: the public set's rotation, in mode spacings (0.5: every public mode half-way between two private ones)
PUBLIC_ROTATION = 0.5
#: Fig. 6's lines: the Table 1 rows the toy runs (straightdp_runs.TOY_ROWS, torch-free: the wiring registers each
#: point's ledger lines from it), and their legend
ROWS = TOY_ROWS
LABELS = {"released_only": "moments only (GMM)", "uniform": "uniform DP-SGD", "tha_moments": "StraightDP",
          "public_only": "public flow only (no private data)"}


def w2_empirical(a: np.ndarray, b: np.ndarray) -> float:
    """Exact W2 between the uniform empirical measures of ``a`` and ``b`` (``[n, d]`` each, same n).

    Between two uniform measures on n points each, an optimal coupling is a permutation (the
    transport polytope's vertices are permutation matrices, Birkhoff-von Neumann), so W2^2 is the
    assignment problem on squared distances: scipy's exact solver, O(n^3), no OT library needed.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(f"w2_empirical: needs two [n, d] arrays of the same shape, got {a.shape} and {b.shape}")
    cost = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    rows, cols = linear_sum_assignment(cost)
    return float(math.sqrt(cost[rows, cols].mean()))


@dataclass(frozen=True)
class ToyWorld:
    """What every point of the figure shares (all public or fixed before any private access)."""

    private: Tensor  # [N, 2] float32
    labels: Tensor  # [N] int64
    public: Tensor  # [N_pub, 2] float32
    public_labels: Tensor
    geometry: moments.PublicGeometry
    public_field: GaussianMomentModel
    tau: float
    n_classes: int
    N: int  # the declared size of the private set (data.toy.n): the release's and DP-SGD's N


def toy_world(private: np.ndarray, labels: np.ndarray, *, toy_data: Mapping[str, Any], cfg: Mapping[str, Any],
              seed: int) -> ToyWorld:
    """The public set, the release's public geometry (Sec. 3.1 (iii)) and the horizon tau, for ``seed``.

    N (``toy_data["n"]``) and the classes (``n_modes``) are config constants; a private set of another size
    is refused (a release normalised by N needs exactly N records)."""
    n_classes = int(toy_data["n_modes"])
    if "n" not in toy_data or len(private) != int(toy_data["n"]):
        raise ValueError(f"toy: the private set holds {len(private)} points but the declared size data.toy.n is "
                         f"{toy_data.get('n')!r}")
    pub, pub_y = gaussian_mixture_2d(len(private), n_modes=n_classes, radius=float(toy_data["radius"]),
                                     std=float(toy_data["std"]), seed=seeds.seed_of("straightdp.toy_public", seed),
                                     rotation=PUBLIC_ROTATION)
    rel = cfg["release"]
    z_pub = torch.from_numpy(pub.astype(np.float64))
    y_pub = torch.from_numpy(pub_y)
    geometry = moments.fit_public_geometry(pub.astype(np.float64), p=TOY_RELEASE_P,
                                           clip_quantile=float(rel["clip_quantile"]))
    public_field = GaussianMomentModel.fit(z_pub, y_pub, rank=2, floor=float(rel["floor"]))
    _, _, tau = public_horizon(public_field, z_pub, y_pub, cfg["horizon"], seed)
    return ToyWorld(private=torch.from_numpy(np.asarray(private, dtype=np.float32)),
                    labels=torch.from_numpy(np.asarray(labels, dtype=np.int64)),
                    public=torch.from_numpy(pub), public_labels=y_pub, geometry=geometry,
                    public_field=public_field, tau=tau, n_classes=n_classes, N=int(toy_data["n"]))


def pretrain_public(world: ToyWorld, cfg: Mapping[str, Any], seed: int) -> MLPVelocity:
    """The public velocity MLP by eq. 1 on the public set (EMA weights)."""
    toy = cfg["toy"]
    seeds.seed_globals("straightdp.toy_init", seed)
    model = MLPVelocity(2, num_classes=world.n_classes, hidden=int(toy["hidden"]), depth=int(toy["depth"]))
    res = pretrain_flow(model, world.public, world.public_labels, steps=int(toy["pretrain_steps"]),
                        batch_size=int(toy["batch_size"]), lr=float(toy["lr"]),
                        ema_decay=float(cfg["pretrain"]["ema_decay"]), p_uncond=float(cfg["pretrain"]["p_uncond"]),
                        generator=seeds.torch_generator("straightdp.pretrain", seed), progress=False,
                        desc="toy pretrain")
    return res.ema


@dataclass
class ToyPoint:
    """One point of the figure: samples, the ledger lines it wrote, its certified total eps."""

    samples: np.ndarray
    entries: list[ledger.LedgerEntry]
    eps_certified: float
    wall_s: float


def run_point(run: StraightRun, world: ToyWorld, public_model: MLPVelocity, cfg: Mapping[str, Any], *,
              config_id: str) -> ToyPoint:
    """One (row, eps, seed) of Fig. 6 end to end (module docstring); raises ValueError if the certified
    total eps exceeds the run's budget."""
    start = time.perf_counter()
    n_eval, delta, rel = int(cfg["toy"]["n_eval"]), float(cfg["delta"]), cfg["release"]
    y_eval = balanced_labels(n_eval, world.n_classes)
    gen = seeds.torch_generator("straightdp.sampling", run.seed)
    extra = {"run": run.name, "figure": "straightdp_figure6_toy"}
    entries: list[ledger.LedgerEntry] = []
    prior, field = None, None
    if run.releases:
        plan1, released = release_class_moments(world.private.numpy().astype(np.float64), world.labels.numpy(),
                                                world.geometry, N=world.N, n_classes=world.n_classes,
                                                epsilon=run.release_epsilon(rel), delta=delta, rel=rel, seed=run.seed)
        entries.append(moments.ledger_entry(plan1, stage="straightdp_figure6_toy", config_id=config_id,
                                            seed=run.seed, extra=extra))
        prior, field = plan1.event(), field_of(released)
    if not run.trains:
        samples = field.sample(y_eval, gen).float()
        return ToyPoint(samples.numpy(), entries, entries[0].claimed_epsilon, time.perf_counter() - start)

    sgd = toy_sgd(cfg)
    model = copy.deepcopy(public_model).train().requires_grad_(True)  # the EMA copy comes frozen
    tau = 0.0
    if run.distills and world.tau > 0:
        tau = world.tau
        res = distill_to_field(model, field, tau=tau, steps=int(cfg["toy"]["distill_steps"]),
                               batch_size=int(cfg["toy"]["batch_size"]), lr=float(cfg["toy"]["lr"]),
                               replay=(world.public, None), generator=seeds.torch_generator("straightdp.distill",
                                                                                            run.seed),
                               p_uncond=float(sgd["p_uncond"]), progress=False, desc=f"toy distill {run.name}")
        model.load_state_dict(res.ema.state_dict())
    spectrum = (field if field is not None else world.public_field).spectrum().numpy()
    proxy_gen = seeds.torch_generator("straightdp.proxy", run.seed)
    plan, _ = stage2_plan(run, {"dpsgd": sgd, "delta": delta}, n=world.N, tau=tau, spectrum=spectrum,
                          prior=prior, stage="straightdp_figure6_toy", proxy_grads=lambda p: public_bucket_gradients(
                              model, world.public, world.public_labels, p, n=int(sgd["proxy_examples"]),
                              K=int(sgd["noise_multiplicity"]), generator=proxy_gen,
                              micro_batch=int(sgd["micro_batch"])))
    total = acc.pld_epsilon(tha.with_prior(plan.event(), prior), delta, settings=dpsgd.DPSGD_PLD_SETTINGS)
    if total > run.epsilon:
        raise ValueError(f"toy {run.name}: the plan certifies eps {total:.6g} > target {run.epsilon}")
    res, _ = dpsgd_flow_training(model, plan, world.private, world.labels, sgd=sgd, seed=run.seed,
                                 num_classes=world.n_classes, device=torch.device("cpu"), state_path=None,
                                 run_hash="", checkpoint_every_s=1e9, desc=f"toy {run.name}")
    entries.append(tha.ledger_entry(plan, stage="straightdp_figure6_toy", config_id=config_id, seed=run.seed,
                                    extra={**extra, "row": run.row, "tau": tau, "total_target_epsilon": run.epsilon,
                                           "total_certified_epsilon": total,
                                           "composed_with_release": prior is not None}))
    samples = flow_samples(res.ema.eval(), y_eval, shape=(2,), steps=int(cfg["sampling"]["steps"]),
                           guidance=float(cfg["sampling"]["guidance"]), batch_size=n_eval, generator=gen,
                           null_label=world.n_classes, device=torch.device("cpu"))
    return ToyPoint(samples.numpy(), entries, total, time.perf_counter() - start)


def public_only_samples(public_model: MLPVelocity, world: ToyWorld, cfg: Mapping[str, Any], seed: int) -> np.ndarray:
    """The reference line: the public flow's null-label samples (it has seen no private point)."""
    n_eval = int(cfg["toy"]["n_eval"])
    y = torch.full((n_eval,), world.n_classes, dtype=torch.long)
    x = flow_samples(public_model.eval(), y, shape=(2,), steps=int(cfg["sampling"]["steps"]), guidance=0.0,
                     batch_size=n_eval, generator=seeds.torch_generator("straightdp.sampling", seed),
                     null_label=world.n_classes, device=torch.device("cpu"))
    return x.numpy()


def truth_draws(toy_data: Mapping[str, Any], n: int, seed: int) -> np.ndarray:
    """``n`` fresh draws of the true private mixture (never the private points themselves)."""
    pts, _ = gaussian_mixture_2d(n, n_modes=int(toy_data["n_modes"]), radius=float(toy_data["radius"]),
                                 std=float(toy_data["std"]), seed=seeds.seed_of("straightdp.toy_truth", seed))
    return pts
