"""Is the empirical denoiser a proxy for the neural one? EMPDEN Sec. 3.3, Sec. 6.3, App. F.

Three measurements along the stochastic EDM sampler of eq. 1,

    x_{t - dt} = (1 - 2 dt/t) x_t + (2 dt/t) D(x_t, t) + sqrt(2 t dt) eps,          (eq. 1)

run with the *public* neural denoiser D (the all-neural reference trajectory):

* **Directional proxy** (Table 4, Figure 1): at every grid point t_i of the N = 50 EDM grid,
  cos(x_t - E_hat, x_t - D) between the denoising directions of the empirical denoiser E_hat
  (on the private set) and of D, and the per-step gap ||E_hat - D||^2 (App. F), each
  averaged over trajectories, then mean +- standard error over seeds. E_hat is the clipped,
  publicly normalised denoiser the private sampler really uses (eq. 38 with the sampler's
  ``empden.normaliser``: the same clip, beta and public Z; "the actual denoising direction
  induced by the update rule", Figure 1 caption) and, as a reference, the unclipped normalised
  posterior mean of the empirical measure (eq. 4).
* **Window swap vs noise redraw** (Tables 1, 5, 6): on the N = 39 grid, with the initial
  noise and all step noises fixed, (swap) E_hat replaces D inside one window of steps, (ref.)
  D is kept and only that window's step noises are re-drawn. Each endpoint is compared with
  the all-neural endpoint: embedding distance 1 - cos in the evaluation net's feature space
  and, when a local CLIP checkpoint is configured, in CLIP's (the paper's CLIP; its DINO
  column is not reproduced), PSNR, SSIM and agreement of the evaluation net's labels, with
  (paired) bootstrap CIs.
* **Critical window** (Figure 6a): a classifier's probability of the final sample's label
  along the trajectory, for the noisy iterate x_t and for D(x_t): the evaluation net, and
  zero-shot CLIP (the paper's detector) when configured.

Tables 1, 4, 5, 6 read the private set without DP (as the paper's diagnostics do): they
describe the method and are not private releases, so they carry
``non_private_diagnostic = True`` and write no ledger line. Figure 6a uses no private data.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from pipeline import seeds
from pipeline.config import validate_config
from pipeline.device import resolve_device
from pipeline.diagnostics.classifiers import Classifier, EvalNetClassifier, ZeroShotCLIP
from pipeline.diagnostics.image_metrics import Interval, bootstrap_mean, paired_bootstrap_difference, psnr, ssim
from pipeline.diffusion.schedule import EDMSchedule
from pipeline.diffusion.steps import eq1_step
from pipeline.evaluation.evalnet import EvalNet, load_evalnet
from pipeline.images import to_pixel_scale, to_unit_scale
from pipeline.io import load_split
from pipeline.models.checkpoint import load_denoiser
from pipeline.privacy import empirical_denoiser as emp
from pipeline.privacy.empden_block import EmpdenBlock
from pipeline.privacy.schedule import k_private_steps, log_snr
from pipeline.reporting import save_figure, write_table
from pipeline.sampling.empirical import prepare_public
from pipeline.methods.empden.sample_stage import public_normaliser_data
from pipeline.stage import PipelineError, stage

import matplotlib.pyplot as plt  # noqa: E402  (pipeline.reporting selected the Agg backend)

log = logging.getLogger(__name__)

#: x [b, C, H, W] and a noise level t -> x0_hat [b, C, H, W]
Denoiser = Callable[[torch.Tensor, float], torch.Tensor]
EmpiricalKind = Literal["clipped", "posterior_mean"]
EMPIRICAL_KINDS: tuple[EmpiricalKind, ...] = ("clipped", "posterior_mean")

# Independent random streams of one run (SeedSequence keys), so that e.g. adding a window
# never changes the noise of another one.
_STREAM_START, _STREAM_STEPS, _STREAM_REDRAW, _STREAM_SUBSET = 1, 2, 3, 4


# --------------------------------------------------------------------------- denoisers


def neural_denoiser(model: nn.Module) -> Denoiser:
    """D(x, t) of a loaded ``dpgen-denoiser/1`` network, unconditionally.

    A class-conditional network gets the classifier-free-guidance null label (index
    ``num_classes``, :mod:`pipeline.models.unet`): the diagnostics compare unconditional denoisers.
    """
    config = getattr(getattr(model, "unet", None), "config", None)
    n_embeds = getattr(config, "num_class_embeds", None) if config is not None else None

    @torch.no_grad()
    def denoise(x: torch.Tensor, t: float) -> torch.Tensor:
        labels = None
        if n_embeds:
            labels = torch.full((x.shape[0],), n_embeds - 1, dtype=torch.long, device=x.device)
        sigma = torch.full((x.shape[0],), float(t), dtype=torch.float32, device=x.device)
        return model(x.float(), sigma, class_labels=labels).to(x.dtype)

    return denoise


def posterior_mean(x_t: torch.Tensor, data: emp.PreparedData, t: float,
                   subset: torch.Tensor | None = None) -> torch.Tensor:
    """E[x0 | x_t] of the empirical measure on all of ``data`` or on each row's ``subset`` (eq. 4)."""
    if subset is None:
        return emp.empirical_posterior_mean(x_t, data, t)
    logk = emp.log_gaussian_kernel(x_t, data, t)
    masked = torch.full_like(logk, -math.inf).scatter_(1, subset, logk.gather(1, subset))
    return torch.softmax(masked, dim=1) @ data.x0


@dataclass(frozen=True)
class EmpiricalDenoiser:
    """E_hat(x, t) on the private set, image-shaped in and out (the :data:`Denoiser` interface).

    ``clipped``: eq. 38 with clip norm ``C`` (the block's effective one, ``EmpdenBlock.C_eff``) and
    public normaliser ``beta``, each v divided by the public marginal Z = p_hat_pub(x_t) of
    ``public`` when given (the sampler's ``public_marginal`` normaliser; None: eq. 38's Z = 1);
    ``posterior_mean``: the unclipped, exactly normalised eq. 4.
    ``subset`` [b, B] gives each trajectory of the batch its own B records (Algorithm 1), or
    None for the whole private set.
    """

    data: emp.PreparedData
    kind: EmpiricalKind
    C: float
    beta: float
    subset: torch.Tensor | None = None
    public: emp.PreparedData | None = None

    def __call__(self, x: torch.Tensor, t: float) -> torch.Tensor:
        flat = x.reshape(x.shape[0], -1).to(self.data.x0.dtype)
        if self.kind == "clipped":
            log_z = None if self.public is None else emp.log_public_marginal(flat, self.public, t)
            out = emp.clipped_empirical_denoiser(flat, self.data, t, C=self.C, beta=self.beta, subset=self.subset,
                                                 log_normaliser=log_z)
        elif self.kind == "posterior_mean":
            out = posterior_mean(flat, self.data, t, subset=self.subset)
        else:
            raise ValueError(f"empirical denoiser kind must be one of {EMPIRICAL_KINDS}, got {self.kind!r}")
        return out.reshape(x.shape).to(x.dtype)


# --------------------------------------------------------------------------- the sampler


def sde_step(x: torch.Tensor, x0_hat: torch.Tensor, t: float, t_next: float, eps: torch.Tensor) -> torch.Tensor:
    """One step of eq. 1 from t to t_next with the given standard-normal ``eps`` (held fixed by callers)."""
    return eq1_step(x, x0_hat, t, t_next, eps)


def generator(*keys: int) -> torch.Generator:
    """A CPU generator for one random stream; keys (seed, stream, ...) are mixed by SeedSequence."""
    return torch.Generator().manual_seed(seeds.mix(keys))  # the empden_proxy.* streams of pipeline.seeds


def trajectory_noise(shape: tuple[int, ...], N: int, sigma_max: float, *keys: int,
                     device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(x_T = sigma_max z, eps [N, *shape]): the starting state and the N step noises of a batch.

    Drawn on the CPU from their own streams and then moved, so a run is the same on any device.
    """
    x_T = sigma_max * torch.randn(shape, generator=generator(*keys, _STREAM_START))
    eps = torch.randn((N, *shape), generator=generator(*keys, _STREAM_STEPS))
    return x_T.to(device), eps.to(device)


def run_steps(x: torch.Tensor, times: np.ndarray, eps: torch.Tensor, *, start: int,
              denoiser_at: Callable[[int], Denoiser]) -> torch.Tensor:
    """Steps start..N-1 of eq. 1 (step i goes t_i -> t_{i+1}; ``times`` ends with t_N = 0)."""
    for i in range(start, len(times) - 1):
        t, t_next = float(times[i]), float(times[i + 1])
        x = sde_step(x, denoiser_at(i)(x, t), t, t_next, eps[i])
    return x


def reference_states(x_T: torch.Tensor, times: np.ndarray, eps: torch.Tensor, neural: Denoiser) -> list[torch.Tensor]:
    """The all-neural trajectory: states[i] is x at t_i (states[N] the endpoint)."""
    states = [x_T]
    for i in range(len(times) - 1):
        t, t_next = float(times[i]), float(times[i + 1])
        states.append(sde_step(states[-1], neural(states[-1], t), t, t_next, eps[i]))
    return states


# --------------------------------------------------------------------------- Table 4 / Figure 1


def direction_agreement(x: torch.Tensor, d_neural: torch.Tensor,
                        d_empirical: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: cos(x - E_hat, x - D) (Figure 1) and ||E_hat - D||^2 over all pixels (App. F)."""
    r_e = (x.double() - d_empirical.double()).flatten(1)
    r_n = (x.double() - d_neural.double()).flatten(1)
    sq = (d_empirical.double() - d_neural.double()).flatten(1).pow(2).sum(1)
    return F.cosine_similarity(r_e, r_n, dim=1), sq


def proxy_along_trajectory(x_T: torch.Tensor, times: np.ndarray, eps: torch.Tensor, neural: Denoiser,
                           empirical: Mapping[str, Denoiser]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """cos and ||E_hat - D||^2 [N, b] at every grid point t_0..t_{N-1} of the all-neural trajectory."""
    cos = {k: [] for k in empirical}
    sq = {k: [] for k in empirical}
    x = x_T
    for i in range(len(times) - 1):
        t, t_next = float(times[i]), float(times[i + 1])
        d = neural(x, t)
        for name, e_hat in empirical.items():
            c, s = direction_agreement(x, d, e_hat(x, t))
            cos[name].append(c.cpu().numpy())
            sq[name].append(s.cpu().numpy())
        x = sde_step(x, d, t, t_next, eps[i])
    return {k: (np.stack(cos[k]), np.stack(sq[k])) for k in empirical}


# --------------------------------------------------------------------------- Tables 1, 5, 6


@dataclass(frozen=True)
class Window:
    """Steps first..last (inclusive) of the N-step grid; step i goes t_i -> t_{i+1}."""

    name: str
    first: int
    last: int

    def contains(self, i: int) -> bool:
        return self.first <= i <= self.last


def window_variants(x_T: torch.Tensor, times: np.ndarray, eps: torch.Tensor, neural: Denoiser,
                    empirical: Denoiser, windows: Sequence[Window],
                    redraw: Callable[[Window], torch.Tensor]) -> tuple[torch.Tensor, dict[str, dict[str, torch.Tensor]]]:
    """(all-neural endpoint, {window: {"swap": endpoint, "ref": endpoint}}) from the same x_T and eps.

    ``redraw(w)`` returns fresh step noises [N, ...] for window w (only its steps are used).
    Both variants agree with the reference before the window, so they start from its state.
    """
    states = reference_states(x_T, times, eps, neural)
    out: dict[str, dict[str, torch.Tensor]] = {}
    for w in windows:
        swap = run_steps(states[w.first], times, eps, start=w.first,
                         denoiser_at=lambda i, w=w: empirical if w.contains(i) else neural)
        fresh = redraw(w)
        mixed = torch.stack([fresh[i] if w.contains(i) else eps[i] for i in range(len(eps))])
        ref = run_steps(states[w.first], times, mixed, start=w.first, denoiser_at=lambda _: neural)
        out[w.name] = {"swap": swap, "ref": ref}
    return states[-1], out


def to_pixels(x: torch.Tensor) -> torch.Tensor:
    """Model-scale images ([-1, 1]) as the uint8 grid a released sample would be (float 0..255)."""
    return to_pixel_scale(x, torch.float32)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return F.cosine_similarity(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               dim=1).numpy()


@dataclass(frozen=True)
class EndpointAgreement:
    """Per-trajectory agreement of variant endpoints with the all-neural endpoint."""

    similarity: dict[str, np.ndarray]  # embedding name -> cosine of the two endpoints' embeddings
    psnr_db: np.ndarray
    ssim: np.ndarray
    label_agreement: np.ndarray  # 0/1: same label from the labeller

    @staticmethod
    def concat(parts: Sequence[EndpointAgreement]) -> EndpointAgreement:
        return EndpointAgreement(
            similarity={k: np.concatenate([p.similarity[k] for p in parts]) for k in parts[0].similarity},
            psnr_db=np.concatenate([p.psnr_db for p in parts]), ssim=np.concatenate([p.ssim for p in parts]),
            label_agreement=np.concatenate([p.label_agreement for p in parts]))


def endpoint_agreement(reference: torch.Tensor, variant: torch.Tensor, embedders: Sequence[Classifier],
                       labeller: Classifier) -> EndpointAgreement:
    """Embedding cosines (one per embedder), PSNR, SSIM (on the uint8 grid) and the labeller's agreement."""
    ref_px, var_px = to_pixels(reference).cpu(), to_pixels(variant).cpu()
    sims = {}
    for e in embedders:
        sims[e.name] = cosine_rows(e.features_and_probs(var_px)[0], e.features_and_probs(ref_px)[0])
    p_ref, p_var = labeller.features_and_probs(ref_px)[1], labeller.features_and_probs(var_px)[1]
    return EndpointAgreement(similarity=sims, psnr_db=psnr(var_px, ref_px), ssim=ssim(var_px, ref_px),
                             label_agreement=(p_var.argmax(1) == p_ref.argmax(1)).astype(np.float64))


# --------------------------------------------------------------------------- Figure 6a


def critical_window_probabilities(x_T: torch.Tensor, times: np.ndarray, eps: torch.Tensor, neural: Denoiser,
                                  classifier: Classifier) -> dict[str, np.ndarray]:
    """The classifier's probability of the final label at every t_i, [N, b] per view.

    ``iterate``: the noisy state x_{t_i} shown as an image (what the paper's Figure 6c shows);
    ``denoised``: the denoiser's estimate D(x_{t_i}). The final label is the classifier's label
    of the endpoint x_0.
    """
    iterates, denoised = [], []
    x = x_T
    for i in range(len(times) - 1):
        t, t_next = float(times[i]), float(times[i + 1])
        d = neural(x, t)
        iterates.append(to_pixels(x).cpu())
        denoised.append(to_pixels(d).cpu())
        x = sde_step(x, d, t, t_next, eps[i])
    _, p_end = classifier.features_and_probs(to_pixels(x).cpu())
    label = p_end.argmax(1)
    rows = np.arange(len(label))
    out = {}
    for view, images in (("iterate", iterates), ("denoised", denoised)):
        out[view] = np.stack([classifier.features_and_probs(im)[1][rows, label] for im in images])
    out["final_label"] = label
    return out


# --------------------------------------------------------------------------- stage plumbing

PARAMS_DOC = {
    "diagnostics": "the empden_diagnostics config section (sizes, windows, bootstrap settings)",
    "accounting": "the accounting config section (EDM schedule sigma_min/sigma_max/rho, C, C_scales_with_subset, beta)",
    "config_id": "config id written to every table row",
    "seed": "integer seed of the trajectories (initial noise, step noises, redraws, subsets)",
    "device": "auto | cpu | cuda[:N]",
    "threads": "torch CPU threads (optional)",
    "normaliser": "constant | public_marginal: the sampler's empden.normaliser (public_marginal reads --in public_data)",
    "normaliser_n": "public records behind public_marginal (empden.normaliser_n; null = all)",
}


@dataclass(frozen=True)
class Settings:
    """The stage params validated against the config schema, defaults filled."""

    diag: dict[str, Any]
    accounting: dict[str, Any]
    config_id: str
    seed: int
    device: torch.device
    #: the sampler's normaliser params (``normaliser``, ``normaliser_n``), as empden_sample reads them
    normaliser: dict[str, Any]

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Settings:
        sections = validate_config({"empden_diagnostics": dict(params.get("diagnostics") or {}),
                                    "accounting": dict(params.get("accounting") or {})}, source="params")
        if params.get("threads"):
            torch.set_num_threads(int(params["threads"]))
        return cls(diag=sections["empden_diagnostics"], accounting=sections["accounting"],
                   config_id=str(params.get("config_id", "unknown")), seed=int(params.get("seed", 0)),
                   device=resolve_device(params.get("device", "auto")),
                   normaliser={k: params[k] for k in ("normaliser", "normaliser_n") if k in params})

    def schedule(self, N: int) -> EDMSchedule:
        a = self.accounting
        return EDMSchedule(sigma_min=a["sigma_min"], sigma_max=a["sigma_max"], rho=a["rho"], N=N)

    def block(self, n: int, schedule: EDMSchedule) -> EmpdenBlock:
        """The sampler's block the diagnostic's E_hat stands for: B records per trajectory
        (``empden_diagnostics.B``; all n when null), on every step of ``schedule``, with the
        accounting section's C, its scaling and beta. Its :attr:`~EmpdenBlock.C_eff` is the clip."""
        B = self.diag["B"]
        return EmpdenBlock.from_accounting(self.accounting, schedule=schedule, B=n if B is None else B, n=n,
                                           N_out=self.diag["n_trajectories"], k=schedule.N,
                                           scheme="full_batch" if B is None else "per_output")

    def chunks(self) -> list[tuple[int, int]]:
        """(chunk index, size) of the trajectories processed together."""
        n, b = self.diag["n_trajectories"], self.diag["batch_size"]
        return [(k, min(b, n - s)) for k, s in enumerate(range(0, n, b))]


def _load_private(path: Path, device: torch.device) -> tuple[emp.PreparedData, tuple[int, int, int]]:
    try:
        split = load_split(path)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise PipelineError(f"input private: {exc}") from None
    # the data stage's uint8 images on the [-1, 1] scale the denoisers work in
    x0 = to_unit_scale(split.images, torch.float64)
    return emp.prepare_records(x0, dtype=torch.float64, device=device), tuple(split.images.shape[1:])


def _load_neural(path: Path, device: torch.device, shape: tuple[int, int, int] | None) -> tuple[Denoiser, tuple]:
    model = load_denoiser(path, device, convention="ve_sigma")
    cfg = model.unet.config
    own = (int(cfg.in_channels), int(cfg.sample_size), int(cfg.sample_size))
    if shape is not None and own != tuple(shape):
        raise PipelineError(f"input denoiser: {path} works on images {list(own)} but the data are {list(shape)}")
    return neural_denoiser(model), own


def _load_classifier(path: Path, device: torch.device, shape: tuple[int, int, int]) -> EvalNet:
    net = load_evalnet(path, device=device)
    if tuple(net.in_shape) != tuple(shape):
        raise PipelineError(f"input evalnet: {path} classifies images {list(net.in_shape)} but the samples "
                            f"are {list(shape)}")
    return net


def _empirical(s: Settings, data: emp.PreparedData, kind: EmpiricalKind, chunk: int, b: int,
               public: emp.PreparedData | None = None, *, schedule: EDMSchedule) -> EmpiricalDenoiser:
    """The chunk's empirical denoiser: full private set, or one B-subset per trajectory (Algorithm 1);
    ``public``: the records of the sampler's public-marginal normaliser (None: eq. 38's constant)."""
    B = s.diag["B"]
    subset = None
    if B is not None:
        if B > data.n:
            raise PipelineError(f"config error at empden_diagnostics.B: B={B} exceeds the private set (n={data.n})")
        subset = emp.draw_subsets(data.n, B, b, generator=generator(s.seed, _STREAM_SUBSET, chunk)).to(data.x0.device)
    block = s.block(data.n, schedule)
    return EmpiricalDenoiser(data=data, kind=kind, C=block.C_eff, beta=block.beta, subset=subset, public=public)


def _load_public_normaliser(s: Settings, path: Path | None, data: emp.PreparedData,
                            shape: tuple[int, int, int]) -> emp.PreparedData | None:
    """The sampler's public-marginal normaliser records (params normaliser / normaliser_n, the
    ``empden`` section's), prepared like the private ones; None for eq. 38's constant."""
    try:
        public = public_normaliser_data(s.normaliser, path, shape=shape)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise PipelineError(f"input public_data: {exc}") from None
    return prepare_public(public, data)


def _provenance(s: Settings, data: emp.PreparedData, N: int) -> dict[str, Any]:
    block = s.block(data.n, s.schedule(N))
    return {"N": N, "n_trajectories": s.diag["n_trajectories"], "subset_size": block.B,
            "normaliser": s.normaliser.get("normaliser", "constant"), "C_effective": block.C_eff,
            "beta": block.beta, "non_private_diagnostic": True}


def hybrid_phase(step: int, N: int, handoffs: Sequence[float]) -> str:
    """Which denoiser the hybrid sampler runs at ``step`` (Table 4's last column): the private
    block is the first ceil(p N / 100) steps (:func:`pipeline.privacy.schedule.k_private_steps`)."""
    ks = {p: k_private_steps(N, p) for p in handoffs}
    for p, k in ks.items():
        if step == k:
            return f"switch {p:g}%"
    if step < min(ks.values()):
        return "emp."
    if step > max(ks.values()):
        return "pub."
    return "between handoffs"


# --------------------------------------------------------------------------- stages


@stage("empden_table4_proxy", inputs=("private", "denoiser"), outputs=("table", "figure"),
       optional_inputs=("public_data",), params=PARAMS_DOC)
def empden_table4_proxy(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """EMPDEN Table 4 + Figure 1: cos(x_t - E_hat, x_t - D) and ||E_hat - D||^2 along the trajectory."""
    s = Settings.from_params(params)
    data, shape = _load_private(inputs["private"], s.device)
    neural, _ = _load_neural(inputs["denoiser"], s.device, shape)
    public = _load_public_normaliser(s, inputs.get("public_data"), data, shape)
    schedule = s.schedule(s.diag["proxy_N"])
    times = schedule.times()
    N = schedule.N
    per_seed: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {k: [] for k in EMPIRICAL_KINDS}
    for rep in tqdm(range(s.diag["proxy_seeds"]), desc="proxy seeds"):
        cos = {k: [] for k in EMPIRICAL_KINDS}
        sq = {k: [] for k in EMPIRICAL_KINDS}
        for chunk, b in s.chunks():
            x_T, eps = trajectory_noise((b, *shape), N, schedule.sigma_max, s.seed, rep, chunk, device=s.device)
            emps = {k: _empirical(s, data, k, chunk, b, public, schedule=schedule) for k in EMPIRICAL_KINDS}
            res = proxy_along_trajectory(x_T, times, eps, neural, emps)
            for k in EMPIRICAL_KINDS:
                cos[k].append(res[k][0])
                sq[k].append(res[k][1])
        for k in EMPIRICAL_KINDS:
            # per-seed mean over trajectories, per grid point
            per_seed[k].append((np.concatenate(cos[k], 1).mean(1), np.concatenate(sq[k], 1).mean(1)))
    d = int(np.prod(shape))
    rows = []
    n_seeds = s.diag["proxy_seeds"]
    for k in EMPIRICAL_KINDS:
        cos_s = np.stack([c for c, _ in per_seed[k]])  # [seeds, N]
        sq_s = np.stack([q for _, q in per_seed[k]])
        se = (lambda a: a.std(0, ddof=1) / math.sqrt(n_seeds)) if n_seeds > 1 else (lambda a: np.full(a.shape[1], np.nan))
        for i in range(N):
            rows.append({"empirical": k, "step": i, "t": float(times[i]), "percent_generation": 100.0 * i / N,
                         "log_snr": float(log_snr(times[i])), "cos_mean": float(cos_s[:, i].mean()),
                         "cos_se": float(se(cos_s)[i]), "sq_dist_mean": float(sq_s[:, i].mean()),
                         "sq_dist_se": float(se(sq_s)[i]), "mse_per_pixel_mean": float(sq_s[:, i].mean() / d),
                         "mse_per_pixel_se": float(se(sq_s)[i] / d), "n_seeds": n_seeds,
                         "hybrid_phase": hybrid_phase(i, N, s.diag["handoffs"]), **_provenance(s, data, N)})
    df = pd.DataFrame(rows)
    write_table(df, outputs["table"], config_id=s.config_id, seed=s.seed)
    _figure1(df, schedule, s.diag["handoffs"], outputs["figure"])


def _figure1(df: pd.DataFrame, schedule: EDMSchedule, handoffs: Sequence[float], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    labels = {"clipped": "clipped Ê (sampler's, eq. 38)", "posterior_mean": "unclipped E[x0|xt] (eq. 4)"}
    for k, g in df.groupby("empirical", sort=False):
        ax.plot(g["log_snr"], g["cos_mean"], "o-", ms=3, label=labels.get(k, k))
        se = g["cos_se"].fillna(0.0)
        ax.fill_between(g["log_snr"], g["cos_mean"] - se, g["cos_mean"] + se, alpha=0.25)
    t = schedule.times()
    for p in handoffs:
        k = k_private_steps(schedule.N, p)
        if k < schedule.N:
            ax.axvline(float(log_snr(t[k])), color="grey", ls=":", lw=1)
            ax.text(float(log_snr(t[k])), 0.02, f"{p:g}%", fontsize=7, rotation=90, va="bottom")
    low = min(-0.05, float((df["cos_mean"] - df["cos_se"].fillna(0.0)).min()) - 0.05)  # cos can turn negative
    ax.set(xlabel="log SNR = log(1/(4t²))", ylabel="cos(xt − Ê, xt − D)", ylim=(low, 1.05),
           title="Empirical vs neural denoising direction")
    ax.legend(fontsize=7, loc="upper right")  # the handoff labels sit at the bottom
    save_figure(fig, path)


def _windows(s: Settings) -> list[Window]:
    N = s.diag["swap_N"]
    out = []
    for w in s.diag["windows"]:
        if not 0 <= w["first"] <= w["last"] < N:
            raise PipelineError(f"config error at empden_diagnostics.windows: window {w['name']!r} "
                                f"(steps {w['first']}-{w['last']}) must satisfy 0 <= first <= last < swap_N={N}")
        out.append(Window(w["name"], int(w["first"]), int(w["last"])))
    if len({w.name for w in out}) != len(out):
        raise PipelineError("config error at empden_diagnostics.windows: window names must be unique")
    return out


def _ci_columns(prefix: str, iv: Interval) -> dict[str, float]:
    return {prefix: iv.estimate, f"{prefix}_low": iv.low, f"{prefix}_high": iv.high}


def _clip(s: Settings) -> ZeroShotCLIP | None:
    """Zero-shot CLIP when the config names a model and a local checkpoint (paper scale), else None."""
    c = s.diag["clip"]
    if not (c["model"] and c["checkpoint"]):
        return None
    return ZeroShotCLIP(c["model"], c["checkpoint"], c["class_names"] or [], prompt=c["prompt"], device=s.device)


@stage("empden_table1_window_swap", inputs=("private", "denoiser", "evalnet"),
       outputs=("table1", "table5", "table6"), optional_inputs=("public_data",), params=PARAMS_DOC)
def empden_table1_window_swap(inputs: Mapping[str, Path], outputs: Mapping[str, Path],
                              params: Mapping[str, Any]) -> None:
    """EMPDEN Tables 1, 5, 6: swap the empirical denoiser into one window vs redraw that window's noise."""
    s = Settings.from_params(params)
    data, shape = _load_private(inputs["private"], s.device)
    neural, _ = _load_neural(inputs["denoiser"], s.device, shape)
    public = _load_public_normaliser(s, inputs.get("public_data"), data, shape)
    labeller = EvalNetClassifier(_load_classifier(inputs["evalnet"], s.device, shape))
    clip = _clip(s)
    embedders: list[Classifier] = [labeller] + ([clip] if clip is not None else [])
    schedule = s.schedule(s.diag["swap_N"])
    times = schedule.times()
    windows = _windows(s)
    agree: dict[tuple[str, str], list[EndpointAgreement]] = {(w.name, v): [] for w in windows for v in ("swap", "ref")}
    for chunk, b in tqdm(s.chunks(), desc="window swap batches"):
        x_T, eps = trajectory_noise((b, *shape), schedule.N, schedule.sigma_max, s.seed, chunk, device=s.device)
        e_hat = _empirical(s, data, s.diag["empirical"], chunk, b, public, schedule=schedule)
        w_index = {w.name: j for j, w in enumerate(windows)}

        def redraw(w: Window) -> torch.Tensor:
            g = generator(s.seed, _STREAM_REDRAW, chunk, w_index[w.name])
            return torch.randn(eps.shape, generator=g).to(s.device)

        ref_end, variants = window_variants(x_T, times, eps, neural, e_hat, windows, redraw)
        for w in windows:
            for v in ("swap", "ref"):
                agree[(w.name, v)].append(endpoint_agreement(ref_end, variants[w.name][v], embedders, labeller))
    boot = {"confidence_level": s.diag["confidence_level"], "n_resamples": s.diag["bootstrap_resamples"],
            "seed": s.seed}
    t1, t5, t6 = [], [], []
    for w in windows:
        cat = {v: EndpointAgreement.concat(agree[(w.name, v)]) for v in ("swap", "ref")}
        base = {"window": w.name, "first_step": w.first, "last_step": w.last, "t_first": float(times[w.first]),
                "t_last": float(times[w.last]), "empirical": s.diag["empirical"], **_provenance(s, data, schedule.N),
                "confidence_level": s.diag["confidence_level"]}
        for e in embedders:
            dist_swap, dist_ref = 1.0 - cat["swap"].similarity[e.name], 1.0 - cat["ref"].similarity[e.name]
            swap_d, ref_d = float(dist_swap.mean()), float(dist_ref.mean())
            t1.append({**base, "embedding": e.name, "swap_distance": swap_d, "ref_distance": ref_d,
                       "rel_swap_over_ref": swap_d / ref_d if ref_d > 0 else math.nan})
            t5.append({**base, "embedding": e.name,
                       **_ci_columns("swap_similarity", bootstrap_mean(1.0 - dist_swap, **boot)),
                       **_ci_columns("ref_similarity", bootstrap_mean(1.0 - dist_ref, **boot)),
                       **_ci_columns("delta_distance_ref_minus_swap",
                                     paired_bootstrap_difference(dist_ref, dist_swap, **boot))})
            log.info("window %s, %s: 1-cos swap %.4f ref %.4f", w.name, e.name, swap_d, ref_d)
        for v in ("swap", "ref"):
            a = cat[v]
            t6.append({**base, "variant": v, "labeller": labeller.name,
                       **_ci_columns("psnr_db", bootstrap_mean(a.psnr_db, **boot)),
                       **_ci_columns("ssim", bootstrap_mean(a.ssim, **boot)),
                       **_ci_columns("label_agreement", bootstrap_mean(a.label_agreement, **boot))})
    write_table(pd.DataFrame(t1), outputs["table1"], config_id=s.config_id, seed=s.seed)
    write_table(pd.DataFrame(t5), outputs["table5"], config_id=s.config_id, seed=s.seed)
    write_table(pd.DataFrame(t6), outputs["table6"], config_id=s.config_id, seed=s.seed)


@stage("empden_figure6_critical_window", inputs=("denoiser", "evalnet"), outputs=("table", "figure"),
       params=PARAMS_DOC)
def empden_figure6_critical_window(inputs: Mapping[str, Path], outputs: Mapping[str, Path],
                                   params: Mapping[str, Any]) -> None:
    """EMPDEN Figure 6a: a classifier's probability of the final label along the neural trajectory.

    The evaluation net always; zero-shot CLIP as well when the config names its checkpoint.
    """
    s = Settings.from_params(params)
    neural, shape = _load_neural(inputs["denoiser"], s.device, None)
    clip = _clip(s)
    classifiers: list[Classifier] = [EvalNetClassifier(_load_classifier(inputs["evalnet"], s.device, shape))]
    classifiers += [clip] if clip is not None else []
    schedule = s.schedule(s.diag["critical_window_N"])
    times = schedule.times()
    probs: dict[tuple[str, str], list[np.ndarray]] = {(c.name, v): [] for c in classifiers
                                                      for v in ("iterate", "denoised")}
    for chunk, b in tqdm(s.chunks(), desc="critical window batches"):
        x_T, eps = trajectory_noise((b, *shape), schedule.N, schedule.sigma_max, s.seed, chunk, device=s.device)
        for c in classifiers:
            res = critical_window_probabilities(x_T, times, eps, neural, c)
            for view in ("iterate", "denoised"):
                probs[(c.name, view)].append(res[view])
    rows = []
    for (name, view), parts in probs.items():
        p = np.concatenate(parts, axis=1)  # [N, n]
        for i in range(schedule.N):
            rows.append({"classifier": name, "view": view, "step": i, "t": float(times[i]),
                         "percent_generation": 100.0 * i / schedule.N, "log_snr": float(log_snr(times[i])),
                         "prob_final_label_mean": float(p[i].mean()),
                         "prob_final_label_se": float(p[i].std(ddof=1) / math.sqrt(p.shape[1])) if p.shape[1] > 1
                         else math.nan, "N": schedule.N, "n_trajectories": p.shape[1]})
    df = pd.DataFrame(rows)
    write_table(df, outputs["table"], config_id=s.config_id, seed=s.seed)
    _figure6(df, outputs["figure"])


def _figure6(df: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for (name, view), g in df.groupby(["classifier", "view"], sort=False):
        what = "x_t" if view == "iterate" else "D(x_t)"
        ax.plot(g["t"], g["prob_final_label_mean"], "o-", ms=3, label=f"{name}: {what}")
        se = g["prob_final_label_se"].fillna(0.0)
        ax.fill_between(g["t"], g["prob_final_label_mean"] - se, g["prob_final_label_mean"] + se, alpha=0.25)
    ax.set_xscale("log")
    ax.invert_xaxis()
    ax.set(xlabel="noise level t (generation runs left to right)", ylabel="P(final label)", ylim=(-0.02, 1.02),
           title="Critical window: classifier along the trajectory")
    ax.legend(fontsize=7)
    save_figure(fig, path)
