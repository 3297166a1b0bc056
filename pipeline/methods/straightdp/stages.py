"""STRAIGHTDP's DAG stages (Che, Xu & Wu 2026): public geometry and horizon, public pretraining,
the moment release (Stage 1), THA DP-SGD (Stage 2) and sampling.

One run is a :class:`pipeline.methods.straightdp.runs.StraightRun` (Table 1 row, total eps, seed);
its name is the path token the rules use. The stages, in DAG order:

* ``straightdp_geometry`` (public only): the PCA basis and feature clip R of the release
  (Sec. 3.1 (iii)), the non-private moment model of the public set, Fig. 2a's cosine curve between
  its analytic field (Prop. 3.1) and the empirical field, and the horizon tau (its knee, capped at
  ``horizon.tau_max``).
* ``pretrain_straightdp`` (public only): the class-conditional MM-DiT velocity network trained by
  eq. 1 on the wrong-domain public set (App. E, scaled to the embedded budget).
* ``release_moments`` (private, Stage 1, Prop. B.9): u = (n_y, S_y / 2R) and the second moment
  through one Gaussian multiplier calibrated to the run's Stage-1 budget; the released Gaussian
  class model (post-processing) and the ledger line ``moment_release``.
* ``train_straightdp`` (private, Stage 2, Sec. 3.2): for the ``*_moments`` rows the release is
  first distilled into the weights for t < tau (public replay beyond); then DP-SGD of the flow on
  [tau, 1] (on [0, 1] without a release) under a uniform or THA plan. The plan's one noise std is
  calibrated so that the certified PLD eps of Composed([release, THA]) meets the run's total eps
  (the release's event is read from its ledger line); the THA plan is picked among the shape
  family by a proxy computed on PUBLIC gradients only. Ledger line ``tha_dpsgd``.
* ``sample_straightdp`` (post-processing): labelled samples from the released moments
  (``released_only``), the public flow guided from t0 by the release (``public_guidance``), or
  the trained flow (Euler + classifier-free guidance).

Every parameter a stage reads comes from the config's ``straightdp`` section (``params["straightdp"]``),
whose defaults live in the schema only (:func:`pipeline.config.schema_defaults`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pipeline import distributed, seeds
from pipeline.config import deep_merge, schema_defaults, schema_keys
from pipeline.data.stage import prepare_public  # noqa: F401  (the CLI's prepare_public: STAGES name it here)
from pipeline.device import resolve_device
from pipeline.flow.backbone import FLOW_PRECOND, FlowSpec, build_flow_model, flow_spec
from pipeline.flow.field import CosineCurve, GaussianMomentModel, field_cosine_curve, guided_start, knee_horizon
from pipeline.flow.rectified import VelocityFn, euler_sample, flow_loss
from pipeline.flow.train import distill_to_field, pretrain_flow
from pipeline.images import to_uint8
from pipeline.io import Split, atomic_path, read_json, save_split, write_json
from pipeline.models.checkpoint import load_denoiser, read_denoiser_backbone, save_denoiser
from pipeline.models.precision import PARAM_DOC as PRECISION_DOC
from pipeline.models.precision import in_precision, precision_of, recorded, refuse_in_private_training
from pipeline.privacy import accountants as acc
from pipeline.privacy import dpsgd, ledger, moments, tha
from pipeline.stage import PipelineError, stage
from pipeline.training import loop
from pipeline.training.data import (PRIVATE_DOC, check_declared, declared_private, drop_labels, load_training_split,
                                    to_model_scale)
from pipeline.methods.straightdp.runs import StraightRun, stage2_config

log = logging.getLogger(__name__)

CONVENTION = "rectified_flow_t"
#: the grid of Fig. 2a's cosine curve: t in [0, T_MAX_CURVE] (the field is exact at t = 0, and
#: the curve has long fallen well before t = 1, where the velocity's 1 / (1 - t) blows up)
T_MAX_CURVE = 0.9

SECTION_DOC = "the config's straightdp section (absent keys take the schema's defaults)"
COMMON_DOC = {
    "straightdp": SECTION_DOC,
    "seed": "integer seed (the run's seed; default 0)",
    "config_id": "id of the configuration (recorded on ledger lines and in model metas)",
    "device": "auto | cpu | cuda[:N] (default auto)",
    "threads": "torch CPU threads (default 1)",
    "private": PRIVATE_DOC + " (release_moments, train_straightdp)",
    ledger.BINDING_PARAM: ledger.BINDING_DOC + " (release_moments, train_straightdp)",
    "public_model": "the imported public flow's hashes (train_straightdp, sample_straightdp of a main run; "
                    "pipeline/flow/public.py): in the config id only",
    "batch_gpu": "optional: examples per forward/backward pass of pretrain_straightdp and train_straightdp's "
                 "distillation, reached by gradient accumulation (the plan's, when a batch does not fit "
                 "slurm.gpu_mem_gb); not in the config id",
}


# --------------------------------------------------------------------------- params

def section(params: Mapping[str, Any]) -> dict[str, Any]:
    """The ``straightdp`` section of ``params`` over the schema's defaults (two levels deep, as the
    schema nests it); an unknown key is a one-line error."""
    defaults = schema_defaults("straightdp")
    given = params.get("straightdp") or {}
    # the schema's keys, not the defaults': opt-in keys (space, flow.stream_clamp, ...) have no default
    known = schema_keys("straightdp")
    for key, value in given.items():
        if key not in known:
            raise PipelineError(f"param straightdp.{key}: unknown key (known: {', '.join(known)})")
        if isinstance(value, Mapping):
            sub = schema_keys("straightdp", key)
            unknown = sorted(set(value) - set(sub))
            if unknown:
                raise PipelineError(f"param straightdp.{key}.{unknown[0]}: unknown key (known: {', '.join(sub)})")
    return deep_merge(defaults, given)


def _setup(params: Mapping[str, Any]) -> tuple[dict[str, Any], int, torch.device]:
    cfg = section(params)
    seed = int(params.get("seed", 0))
    device = resolve_device(str(params.get("device", "auto")))
    if device.type == "cpu":
        torch.set_num_threads(int(params.get("threads", 1)))
    return cfg, seed, device


def _batch_gpu(params: Mapping[str, Any]) -> int | None:
    """params.batch_gpu: examples per forward/backward pass of a public training (pretraining, distillation), the
    plan's when the batch does not fit slurm.gpu_mem_gb (pipeline/training/accumulate.py); None: the whole batch."""
    value = params.get("batch_gpu")
    if value is not None and not (isinstance(value, int) and value >= 1):
        raise PipelineError(f"param batch_gpu must be an integer >= 1, got {value!r}")
    return value


def _run(params: Mapping[str, Any]) -> StraightRun:
    try:
        return StraightRun.from_name(str(params["run"]))
    except KeyError:
        raise PipelineError("param run (the run's name, e.g. tha_moments_eps1_seed0) is required") from None
    except ValueError as exc:
        raise PipelineError(f"param run: {exc}") from None


def flat(split: Split) -> Tensor:
    """The images of ``split`` as float64 rows in the model's [-1, 1] scale, ``[n, d]``."""
    return to_model_scale(split.images).to(torch.float64).reshape(len(split), -1)


# --------------------------------------------------------------------------- public geometry + horizon

def read_geometry(path: str | Path) -> tuple[moments.PublicGeometry, np.ndarray]:
    """The release's public geometry and the public covariance spectrum (for THA's Vbar) from ``path``."""
    try:
        with np.load(path, allow_pickle=False) as z:
            geometry = moments.PublicGeometry(mean=z["mean"], basis=z["basis"], R=float(z["R"]))
            return geometry, np.array(z["public_eigvals"])
    except (OSError, KeyError, ValueError) as exc:
        raise PipelineError(f"input geometry {path}: not a STRAIGHTDP geometry file ({exc})") from None


@stage("straightdp_geometry", inputs=("public",), outputs=("geometry", "horizon"), params=COMMON_DOC)
def straightdp_geometry(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """PCA basis + clip R (Sec. 3.1 (iii)), Fig. 2a's cosine curve and the horizon tau, from public data only."""
    cfg, seed, _ = _setup(params)
    rel, hor = cfg["release"], cfg["horizon"]
    public, _ = load_training_split(inputs["public"], "public")
    z = flat(public)
    y = torch.from_numpy(public.labels.astype(np.int64))
    try:
        geometry = moments.fit_public_geometry(z.numpy(), p=int(rel["p"]), clip_quantile=float(rel["clip_quantile"]))
    except moments.MomentsError as exc:
        raise PipelineError(f"stage straightdp_geometry: {exc}") from None
    rank = min(int(rel["rank"]), z.shape[0], z.shape[1])
    model = GaussianMomentModel.fit(z, y, rank=rank, floor=float(rel["floor"]))
    spectrum = model.spectrum().numpy()
    with atomic_path(outputs["geometry"], suffix=".npz") as tmp:
        np.savez(tmp, mean=geometry.mean, basis=geometry.basis, R=np.array(geometry.R), public_eigvals=spectrum)

    ts, curve, tau = public_horizon(model, z, y, hor, seed)
    write_json(outputs["horizon"], {
        "format": "straightdp-horizon/1", "ts": ts.tolist(), "conditional_worst": curve.conditional_worst.tolist(),
        "unconditional": curve.unconditional.tolist(), "conditional_per_class": curve.conditional_per_class.tolist(),
        "tau": tau, "tau_max": float(hor["tau_max"]), "threshold": 0.9, "p": geometry.p, "R": geometry.R,
        "rank": rank, "n_public": len(public), "source": "public data only (Sec. 3.1, Fig. 2a)"})
    log.info("straightdp_geometry: p=%d, R=%.4g, tau=%.3g (cosine at tau: %.3f)", geometry.p, geometry.R, tau,
             float(np.interp(tau, ts, curve.conditional_worst)))


def public_horizon(model: GaussianMomentModel, z: Tensor, y: Tensor, hor: Mapping[str, Any], seed: int
                   ) -> tuple[np.ndarray, CosineCurve, float]:
    """Fig. 2a's cosine curve of the public Gaussian field ``model`` against the empirical one on the public
    rows ``z``/``y`` and the horizon tau at its knee, capped at ``hor["tau_max"]`` (Sec. 3.1, public only)."""
    ts = np.linspace(0.0, T_MAX_CURVE, int(hor["n_times"]))
    curve = field_cosine_curve(model, z, y, ts, n_probe=int(hor["n_probe"]),
                               generator=seeds.torch_generator("straightdp.horizon", seed))
    return ts, curve, knee_horizon(ts, curve.conditional_worst, tau_max=float(hor["tau_max"]))


# --------------------------------------------------------------------------- public pretraining

@stage("pretrain_straightdp", inputs=("public",), outputs=("model",),
       params={**COMMON_DOC, "n_classes": "number of private classes (the label tables' size; public knowledge)",
               "checkpoint_dir": "optional folder of the resumable state", "precision": PRECISION_DOC})
def pretrain_straightdp(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Public pretraining of the class-conditional MM-DiT flow by eq. 1 (App. E, Table 9)."""
    cfg, seed, device = _setup(params)
    pre = cfg["pretrain"]
    if pre.get("source") == "diffusers":
        raise PipelineError("stage pretrain_straightdp: straightdp.pretrain.source is diffusers: rule "
                            "import_straightdp loads the public flow instead")
    pre = {k: v for k, v in pre.items() if k != "source"}  # "train", as absent: the resume hash stays as it was
    public, sha = load_training_split(inputs["public"], "public")
    n_classes = int(params.get("n_classes", int(public.labels.max()) + 1))
    if int(public.labels.max()) >= n_classes:
        raise PipelineError(f"param n_classes: {n_classes} label rows but the public labels go up to "
                            f"{int(public.labels.max())}")
    spec = flow_spec(cfg, public, n_classes)
    seeds.seed_globals("straightdp.pretrain_init", seed)
    model = build_flow_model(spec).to(device)
    images = to_model_scale(public.images).to(device)
    labels = torch.from_numpy(public.labels.astype(np.int64)).to(device)
    precision = precision_of(params, "pretrain_straightdp")
    mixed = recorded(precision)
    run_params = {"pretrain": pre, "spec": spec.to_json(), "public_sha256": sha, "seed": seed, **mixed}
    ck_dir = Path(params["checkpoint_dir"]) if params.get("checkpoint_dir") else loop.checkpoint_dir_for(
        outputs["model"], "pretrain_straightdp")
    res = pretrain_flow(model, images, labels, steps=int(pre["steps"]), batch_size=int(pre["batch_size"]),
                        lr=float(pre["lr"]), ema_decay=float(pre["ema_decay"]), p_uncond=float(pre["p_uncond"]),
                        generator=seeds.torch_generator("straightdp.pretrain", seed),
                        state_path=ck_dir / loop.STATE_FILE, run_hash=loop.params_hash(run_params),
                        checkpoint_every_s=float(cfg["checkpoint_every_s"]), desc="pretrain_straightdp",
                        micro_batch=_batch_gpu(params), precision=precision)
    tail = res.losses[-50:] if len(res.losses) else [float("nan")]
    meta = {"stage": "pretrain_straightdp", "private": False, "public_sha256": sha, "steps": int(pre["steps"]),
            "final_loss_mean50": float(np.mean(tail)), "seed": seed, "config_id": params.get("config_id"), **mixed}
    save_denoiser(outputs["model"], res.ema.cpu(), backbone=spec, precond=FLOW_PRECOND, meta=meta)
    log.info("pretrain_straightdp: %d steps in %.1f s, public loss (last 50) %.4f", int(pre["steps"]), res.wall_s,
             meta["final_loss_mean50"])


def load_flow(path: str | Path, device: torch.device) -> tuple[torch.nn.Module, FlowSpec]:
    model = load_denoiser(path, device=device, convention=CONVENTION)
    kind, spec = read_denoiser_backbone(path)
    if not isinstance(spec, FlowSpec):
        raise PipelineError(f"{path}: holds a {kind} backbone, expected the STRAIGHTDP flow")
    return model, spec


# --------------------------------------------------------------------------- Stage 1

@stage("release_moments", inputs=("data", "geometry"), outputs=("moments", "ledger"),
       params={**COMMON_DOC, "run": "the run's name (row, total eps, seed)"})
def release_moments(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Stage 1 (Prop. B.9): the class-conditional moment release at the run's Stage-1 budget, its ledger line."""
    cfg, _, _ = _setup(params)
    run = _run(params)
    if not run.releases:
        raise PipelineError(f"stage release_moments: row {run.row} releases no moments")
    rel = cfg["release"]
    eps1 = run.release_epsilon(rel)
    N, n_classes = declared_private(params, "release_moments")
    split, sha = load_training_split(inputs["data"], "data")
    check_declared(split, N=N, n_classes=n_classes, stage="release_moments")
    binding = ledger.binding_of(params, data_sha256=sha, stage="release_moments")
    geometry, _ = read_geometry(inputs["geometry"])
    try:
        plan, model = release_class_moments(flat(split).numpy(), split.labels.astype(np.int64), geometry, N=N,
                                            n_classes=n_classes, epsilon=eps1, delta=float(cfg["delta"]), rel=rel,
                                            seed=run.seed)
    except moments.MomentsError as exc:
        raise PipelineError(f"stage release_moments: {exc}") from None
    entry = moments.ledger_entry(plan, stage="release_moments", config_id=str(params.get("config_id", "unknown")),
                                 seed=run.seed, extra={"run": run.name, "target_epsilon": eps1,
                                                       "total_epsilon": run.epsilon, "data_sha256": sha})
    if entry.claimed_epsilon > eps1:
        raise PipelineError(f"stage release_moments: certified eps {entry.claimed_epsilon:.6g} > target {eps1}")
    model.save(outputs["moments"])
    with atomic_path(outputs["ledger"], suffix=".jsonl") as tmp:
        ledger.append_entry(tmp, entry, binding)
    log.info("release_moments %s: sigma %.4g for eps %.4g (of %.4g), %d classes fell back", run.name, plan.sigma,
             entry.claimed_epsilon, run.epsilon, int(model.fell_back.sum()))


def release_class_moments(z: np.ndarray, labels: np.ndarray, geometry: moments.PublicGeometry, *, N: int,
                          n_classes: int, epsilon: float, delta: float, rel: Mapping[str, Any], seed: int
                          ) -> tuple[moments.MomentReleasePlan, moments.ReleasedMoments]:
    """Stage 1 on private rows ``z`` ``[n, d]`` (model scale) and ``labels`` ``[n]`` (Prop. B.9): the release
    calibrated to ``epsilon`` in the public ``geometry``, then its post-processing into the class-conditional
    Gaussian model (rank, floor, min_count of ``rel``).

    ``N`` and ``n_classes`` are the declared public constants (:func:`pipeline.config.declared_private`), never
    ``len(z)`` or the labels' range: M2's noise std sigma 2R^2/N must be the same on add/remove neighbours (App.
    B.3's padded databases), else the two output laws differ in variance and the PLD of the line is no bound.
    The plan is fixed before ``z`` is read; the stage checks n = N (:func:`check_declared`)."""
    plan = moments.calibrate_release(target_epsilon=epsilon, delta=delta, R=geometry.R, N=N,
                                     n_classes=n_classes, p=geometry.p)
    noisy = moments.release(geometry.features(z), labels, plan, generator=seeds.numpy_rng("straightdp.release", seed))
    model = moments.moment_model(noisy, geometry, rank=min(int(rel["rank"]), geometry.p),
                                 floor=float(rel["floor"]), min_count=float(rel["min_count"]))
    return plan, model


def field_of(released: moments.ReleasedMoments, device: torch.device | str = "cpu") -> GaussianMomentModel:
    """The released moments as the analytic field's Gaussian model (Prop. 3.1), float64."""
    return GaussianMomentModel.from_arrays(pi=released.pi, mu=released.mu, eigvecs=released.eigvecs,
                                           eigvals=released.eigvals, floor=released.floor, device=device)


def release_event(path: str | Path) -> Any:
    """The dp_event of the one ``moment_release`` line of a run's Stage-1 transcript."""
    try:
        return ledger.only_line(path, moments.MECHANISM).dp_event()
    except ledger.LedgerError as exc:
        raise PipelineError(str(exc)) from None


# --------------------------------------------------------------------------- Stage 2

def public_bucket_gradients(model: torch.nn.Module, images: Tensor, labels: Tensor, plan: tha.THAPlan, *, n: int,
                            K: int, generator: torch.Generator, micro_batch: int) -> list[Tensor]:
    """Per-example gradients ``[n, P]`` of the PUBLIC model on ``n`` PUBLIC examples per bucket (``images``
    in model scale, ``[N, ...]``; ``labels`` ``[N]``), times drawn in the bucket: the input of the planner's
    proxy (App. B.5 step 3)."""
    params = dpsgd.trainable_parameters(model)
    loss_fn = dpsgd.multiplicity_loss(flow_loss)
    multiplicity = dpsgd.NoiseMultiplicity(K, tha.uniform_time_sampler)
    out = []
    for k in range(plan.K):
        idx = torch.randint(len(images), (n,), generator=generator)
        rows = []
        for s in range(0, n, micro_batch):
            chunk_idx = idx[s:s + micro_batch]
            x = images[chunk_idx].to(next(model.parameters()).device)
            t, xi = multiplicity.draw(x, generator, plan.time_range(k))
            y = labels[chunk_idx].to(x.device)
            grads, _ = dpsgd.per_example_gradients(model, loss_fn, (x, t, xi, y), params)
            rows.append(torch.cat([g.reshape(g.shape[0], -1) for g in grads.values()], dim=1).detach().cpu())
        out.append(torch.cat(rows))
    return out


def stage2_plan(run: StraightRun, cfg: Mapping[str, Any], *, n: int, tau: float, spectrum: np.ndarray,
                prior: Any, proxy_grads: Any, stage: str = "train_straightdp"
                ) -> tuple[tha.THAPlan, dict[float, float]]:
    """The run's Stage-2 plan, calibrated so Composed([prior, THA]) meets the run's total eps.

    ``uniform`` rows: one bucket, one clip C_ref. ``tha`` rows: K equal buckets on [tau, 1], one
    candidate per beta of the shape family (uniform always among them), the one with the highest
    PUBLIC proxy kept. ``proxy_grads(plan) -> list of [n_k, P]`` gives public gradients per bucket.
    """
    # what the configuration fixes (K, the betas, q = B / N, T, C_ref): the wiring registers the same for the replay
    st = stage2_config(run, cfg["dpsgd"], n)
    common = dict(vbar=tha.gaussian_vbar(spectrum.tolist()), sampling_rate=st.sampling_rate,
                  dataset_size=st.dataset_size, steps=st.steps, delta=float(cfg["delta"]), target_epsilon=run.epsilon,
                  c_ref=st.clip_ref, prior_event=prior)
    try:
        candidates = tha.plan_candidates(edges=tha.bucket_edges(tau, st.buckets), betas=st.betas, **common)
        if run.plan == "uniform":
            (plan,) = candidates
            return plan, {}
        return tha.select_plan(candidates, lambda p: tha.gradient_snr_proxy(proxy_grads(p), p))
    except dpsgd.DPSGDError as exc:
        raise PipelineError(f"stage {stage} {run.name}: {exc}") from None


def stage2_decision(plan: tha.THAPlan, *, tau: float, data_sha256: str) -> dict[str, Any]:
    """What every data-parallel rank of Stage 2 must hold exactly as rank 0 does before the first private step:
    the horizon tau, the private split the shared Poisson sample indexes (its SHA-256, which rank 0's ledger
    line binds) and every field of the THA plan (buckets, C_k, the one noise std s, q, N, T, delta, beta)."""
    return {"tau": tau, "data_sha256": data_sha256, **dataclasses.asdict(plan)}


def agreed_stage2_plan(run: StraightRun, cfg: Mapping[str, Any], *, n: int, tau: float, spectrum: np.ndarray,
                       prior: Any, proxy_grads: Any, data_sha256: str, stage: str = "train_straightdp"
                       ) -> tuple[tha.THAPlan, dict[float, float]]:
    """:func:`stage2_plan` on this rank, then rank 0's plan on every rank, each rank's own checked against it.

    Sec. 3.2 runs Stage 2 as a fully pre-declared workload whose exact composition is verified before training,
    and App. B.5 certifies only "the single plan that is eventually executed". Under data parallelism that plan
    is rank 0's: rank 0 adds the noise (std s) and writes the ledger line. Every rank plans by itself (the
    proxy's public gradients are computed where the model is), but on CUDA nondeterministic kernels can move
    the proxy's arg max over beta, and a rank clipping at its own C_k would break rank 0's certificate. So the
    plan, tau and the data's hash are compared field by field, exactly, with rank 0's
    (:func:`pipeline.distributed.agree_with_rank0`): a difference stops every rank in one line before any
    private step, and otherwise every rank runs rank 0's plan object. Exact float equality is principled: C_k
    and s are CPU float64 functions of beta, tau, the spectrum and the configuration, the same bits on every
    rank that chose the same beta from the same inputs.

    The proxy scores stay each rank's own and are not compared: only rank 0 writes them, and on CUDA they can
    differ in their last bits while the arg max, the only thing that reaches the mechanism, does not.
    One process: the plan :func:`stage2_plan` returns, untouched.
    """
    plan, scores = stage2_plan(run, cfg, n=n, tau=tau, spectrum=spectrum, prior=prior, proxy_grads=proxy_grads,
                               stage=stage)
    mine = stage2_decision(plan, tau=tau, data_sha256=data_sha256)
    agreed = distributed.agree_with_rank0(mine, what=f"stage {stage} {run.name}: the Stage-2 plan")
    if agreed is mine:  # rank 0, or one process
        return plan, scores
    fields = {f.name for f in dataclasses.fields(tha.THAPlan)}
    return tha.THAPlan(**{k: v for k, v in agreed.items() if k in fields}), scores


def dpsgd_flow_training(model: torch.nn.Module, plan: tha.THAPlan, images: Tensor, labels: Tensor, *,
                        sgd: Mapping[str, Any], seed: int, num_classes: int, device: torch.device,
                        state_path: Path | None, run_hash: str, checkpoint_every_s: float, desc: str
                        ) -> tuple[loop.TrainResult, list[dict[str, float] | None]]:
    """Stage 2's training loop (Sec. 3.2): ``plan.steps`` DP-SGD steps of the flow loss (eq. 1) on the
    PRIVATE ``images`` (model scale, ``[N, ...]``) and ``labels`` ``[N]`` (each dropped to the null label
    with ``p_uncond``), per-step clips and noise from ``plan`` (uniform or THA), K time draws per example
    (noise multiplicity), EMA weights; resumable from ``state_path``. Returns the result and App. D.3's
    per-step gradient-norm quantiles (a NON-private diagnostic)."""
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=float(sgd["lr"]))
    gen = seeds.torch_generator("straightdp.draws", seed)
    noise_gen = seeds.torch_generator("straightdp.mechanism_noise", seed, device=device)
    engine = dpsgd.DPSGD(model, dpsgd.multiplicity_loss(flow_loss), plan, microbatch_size=int(sgd["micro_batch"]),
                         multiplicity=dpsgd.NoiseMultiplicity(int(sgd["noise_multiplicity"]), tha.uniform_time_sampler),
                         generator=gen, noise_generator=noise_gen, clipping=str(sgd.get("clipping", "auto")),
                         draws=str(sgd.get("draws", "stream")))
    log.info("STRAIGHTDP DP-SGD: clipped sums by %s", engine.clipping)
    grad_norms: list[dict[str, float] | None] = []

    def step(i: int) -> float:
        engine.steps_taken = i
        # diagnostics: every data-parallel rank's norms (App. D.3's quantiles are over the whole logical batch)
        info = engine.step(optimizer, (images, drop_labels(labels, float(sgd["p_uncond"]), num_classes, gen)),
                           diagnostics=True)
        grad_norms.append(dpsgd.norm_quantiles(info))
        return float("nan")  # the private loss is deliberately not recorded

    res = loop.run_training(model=model, optimizer=optimizer, step_fn=step, total_steps=plan.steps,
                            state_path=state_path, run_hash=run_hash, ema_decay=float(sgd["ema_decay"]),
                            checkpoint_every_s=checkpoint_every_s, generators={"draws": gen, "mechanism": noise_gen},
                            desc=desc, show_loss=False, history=grad_norms)
    return res, grad_norms


@stage("train_straightdp", inputs=("data", "public", "init", "geometry", "horizon"),
       optional_inputs=("moments", "release_ledger"), outputs=("model", "ledger", "metrics"),
       params={**COMMON_DOC, "run": "the run's name (row, total eps, seed)",
               "checkpoint_dir": "optional folder of the resumable state"})
def train_straightdp(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Stage 2 (Sec. 3.2): [distillation of the release for t < tau], then uniform / THA DP-SGD of the flow.

    Data parallel under ``--nproc N`` (``straightdp.gpus``; :mod:`pipeline.distributed`): every rank repeats the
    distillation (public), then takes rank 0's weights; every rank plans, and every rank runs rank 0's plan, its
    own checked against it before any private step (:func:`agreed_stage2_plan`); the DP-SGD steps are split over
    the ranks, rank 0 writes the state and the outputs."""
    refuse_in_private_training(params, "train_straightdp")
    with distributed.data_parallel(str(params.get("device", "auto"))) as (world, device):
        _train_straightdp(inputs, outputs, params, world, device)


def _train_straightdp(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any],
                      world: distributed.World, device: torch.device) -> None:
    cfg, _, _ = _setup(params)
    run = _run(params)
    if not run.trains:
        raise PipelineError(f"stage train_straightdp: row {run.row} trains no flow")
    if run.distills != ("moments" in inputs and "release_ledger" in inputs):
        raise PipelineError(f"stage train_straightdp {run.name}: the *_moments rows need inputs moments and "
                            f"release_ledger, the others neither")
    sgd, dist = cfg["dpsgd"], cfg["distill"]
    n, n_classes = declared_private(params, "train_straightdp")
    split, sha = load_training_split(inputs["data"], "data")
    check_declared(split, N=n, n_classes=n_classes, stage="train_straightdp")  # q = E[batch] / N, N declared
    binding = ledger.binding_of(params, data_sha256=sha, stage="train_straightdp")
    public, _ = load_training_split(inputs["public"], "public")
    model, spec = load_flow(inputs["init"], device)
    if n_classes > spec.num_classes:
        raise PipelineError(f"input init: the flow has {spec.num_classes} label rows, the private source declares "
                            f"{n_classes} classes")
    model.train()
    if run.lora:
        # Table 3's frozen-model route: the public weights stay frozen, DP-SGD (and the distillation of the
        # lora_moments row) train the adapters only, at the LoRA learning rate
        from pipeline.flow.lora import add_lora

        lora = cfg["lora"]
        # peft draws the A matrices from torch's global RNG: seeded from the run's stream, the adapters do not
        # depend on what else ran in the process (two identical runs differed before)
        seeds.seed_globals("straightdp.lora_init", run.seed)
        add_lora(model, rank=int(lora["rank"]), alpha=float(lora["alpha"]))
        sgd, dist = {**sgd, "lr": float(lora["lr"])}, {**dist, "lr": float(lora["lr"])}
    ck_dir = Path(params["checkpoint_dir"]) if params.get("checkpoint_dir") else loop.checkpoint_dir_for(
        outputs["model"], "train_straightdp")
    hashed = ("dpsgd", "distill", "delta", "flow") + (("lora",) if run.lora else ())
    run_hash = loop.params_hash({"run": run.name, "cfg": {k: cfg[k] for k in hashed},
                                 "data": sha, "init": str(inputs["init"])})

    # Stage 1's use: distillation into the weights (post-processing of the release + public data)
    # THA's Vbar: from the release where there is one (post-processing), else from the public geometry
    tau, prior, spectrum = 0.0, None, None
    if not run.distills:
        _, spectrum = read_geometry(inputs["geometry"])
    else:
        tau = float(read_json(inputs["horizon"])["tau"])
        field = field_of(moments.ReleasedMoments.load(inputs["moments"]))
        prior = release_event(inputs["release_ledger"])
        spectrum = field.spectrum().numpy()
        if tau > 0:
            replay = (to_model_scale(public.images).to(device), None)  # wrong-domain labels: null branch only
            res = distill_to_field(model, field, tau=tau, steps=int(dist["steps"]),
                                   batch_size=int(dist["batch_size"]), lr=float(dist["lr"]), replay=replay,
                                   generator=seeds.torch_generator("straightdp.distill", run.seed),
                                   p_uncond=float(sgd["p_uncond"]), state_path=ck_dir / "distill" / loop.STATE_FILE,
                                   run_hash=run_hash, checkpoint_every_s=float(cfg["checkpoint_every_s"]),
                                   desc=f"distill {run.name}", micro_batch=_batch_gpu(params))
            model.load_state_dict(res.ema.state_dict())
    # Every rank distils rather than rank 0 alone: the training loop joins one all-reduce per step, which rank 0
    # alone would wait in for ever, and ranks idle in a broadcast through hours of distillation would pass the
    # collective timeout. Then every rank plans from (and trains) rank 0's weights, distilled or not: on CUDA the
    # ranks' distilled weights can differ in their last bits, and the planner's proxy reads them.
    distributed.broadcast_module(model)

    # Stage 2's mechanism, fixed before any private record is used
    proxy_gen = seeds.torch_generator("straightdp.proxy", run.seed)
    cache: dict[tuple[float, ...], list[Tensor]] = {}

    def proxy_grads(plan: tha.THAPlan) -> list[Tensor]:
        if plan.edges not in cache:  # every candidate shares the buckets: one set of public gradients
            cache[plan.edges] = public_bucket_gradients(model, to_model_scale(public.images),
                                                        torch.from_numpy(public.labels.astype(np.int64)), plan,
                                                        n=int(sgd["proxy_examples"]),
                                                        K=int(sgd["noise_multiplicity"]), generator=proxy_gen,
                                                        micro_batch=int(sgd["micro_batch"]))
        return cache[plan.edges]

    t0 = time.perf_counter()
    plan, scores = agreed_stage2_plan(run, cfg, n=n, tau=tau, spectrum=spectrum, prior=prior,
                                      proxy_grads=proxy_grads, data_sha256=sha)
    total_eps = acc.pld_epsilon(tha.with_prior(plan.event(), prior), plan.delta,
                                    settings=dpsgd.DPSGD_PLD_SETTINGS)
    if total_eps > run.epsilon:
        raise PipelineError(f"stage train_straightdp {run.name}: the plan certifies eps {total_eps:.6g} > "
                            f"target {run.epsilon}")
    planning_s = time.perf_counter() - t0
    log.info("train_straightdp %s: tau=%.3g, beta=%g, C_k=%s, s=%.4g, q=%.4g, T=%d: certified total eps %.4f <= %g "
             "(%.1f s)", run.name, tau, plan.beta, [round(c, 4) for c in plan.clips], plan.noise_std,
             plan.sampling_rate, plan.steps, total_eps, run.epsilon, planning_s)

    images = to_model_scale(split.images).to(device)
    labels = torch.from_numpy(split.labels.astype(np.int64)).to(device)
    res, grad_norms = dpsgd_flow_training(model, plan, images, labels, sgd=sgd, seed=run.seed,
                                          num_classes=spec.num_classes, device=device,
                                          state_path=ck_dir / loop.STATE_FILE, run_hash=run_hash,
                                          checkpoint_every_s=float(cfg["checkpoint_every_s"]),
                                          desc=f"train_straightdp {run.name}")
    if not world.main:
        return  # rank 0 writes the release

    config_id = str(params.get("config_id", "unknown"))
    entry = tha.ledger_entry(plan, stage="train_straightdp", config_id=config_id, seed=run.seed,
                             extra={"run": run.name, "row": run.row, "tau": tau, "total_target_epsilon": run.epsilon,
                                    "total_certified_epsilon": total_eps, "composed_with_release": prior is not None,
                                    "proxy_scores": {str(k): v for k, v in scores.items()}, "data_sha256": sha})
    with atomic_path(outputs["ledger"], suffix=".jsonl") as tmp:
        ledger.append_entry(tmp, entry, binding)
    meta = {"stage": "train_straightdp", "private": True, "run": run.name, "epsilon": total_eps,
            "target_epsilon": run.epsilon, "delta": plan.delta, "tau": tau, "beta": plan.beta,
            "weights": "ema", "seed": run.seed, "config_id": config_id}
    final = res.ema.cpu()
    if run.lora:  # post-processing: the adapters merged into the weights, an ordinary flow checkpoint
        from pipeline.flow.lora import merge_lora

        final = merge_lora(final)
        meta = {**meta, "lora": dict(cfg["lora"])}
    save_denoiser(outputs["model"], final, backbone=spec, precond=FLOW_PRECOND, precond_kwargs=final.precond_kwargs(),
                  meta=meta)
    write_json(outputs["metrics"], {
        "format": "dpgen-train-metrics/1", **meta, "clips": list(plan.clips), "noise_std": plan.noise_std,
        "noise_multipliers": list(plan.noise_multipliers), "edges": list(plan.edges), "steps": plan.steps,
        "sampling_rate": plan.sampling_rate, "proxy_scores": {str(k): v for k, v in scores.items()},
        "planning_s": planning_s, "wall_s_this_run": res.wall_s, "resumed_from": res.resumed_from,
        "device": str(device), "processes": world.size,
        "note": "no training loss is reported: it is a function of the private data",
        "backbone_constraints": {"stream_clamp": spec.stream_clamp, "late_injection": spec.late_injection,
                                 "decoupled_attention": spec.decoupled_attention, "post_hoc": spec.post_hoc},
        "grad_norms_non_private_diagnostic": {
            "note": "per-sample gradient-norm quantiles of the private batches (STRAIGHTDP App. D.3): NOT DP, a "
                    "function of the private data like a training loss; medians over every step of the run "
                    "(a resumed run's earlier steps come from its saved training state)",
            "per_bucket": dpsgd.summarise_norm_quantiles(grad_norms)}})


# --------------------------------------------------------------------------- sampling

def balanced_labels(n: int, n_classes: int) -> Tensor:
    """``n`` labels cycling through the classes (equal counts up to one)."""
    return torch.arange(n) % n_classes


@torch.no_grad()
def flow_samples(model: VelocityFn, y: Tensor, *, shape: tuple[int, ...], steps: int, guidance: float,
                 batch_size: int, generator: torch.Generator, null_label: int, device: torch.device,
                 start: Any = None, t0: float = 0.0) -> Tensor:
    """Euler samples ``[n, *shape]`` of ``model`` for labels ``y``, batch by batch (start: N(0, I) at t0 = 0, or
    ``start(y_batch) -> x_t0`` rows)."""
    from tqdm import tqdm

    out = []
    with tqdm(total=len(y), desc="sample_straightdp", unit="img") as bar:
        for s in range(0, len(y), batch_size):
            yb = y[s:s + batch_size]
            x0 = (torch.randn((len(yb), *shape), generator=generator) if start is None
                  else start(yb).reshape(len(yb), *shape).float())
            x = euler_sample(model, x0=x0.to(device), t0=t0, steps=steps, y=yb.to(device), guidance=guidance,
                             null_label=null_label)
            out.append(x.cpu())
            bar.update(len(yb))
    return torch.cat(out)


def draw_samples(samples_from: str, n: int, *, seed: int, steps: int, guidance: float, batch_size: int,
                 device: torch.device | str, model: VelocityFn | None = None, spec: FlowSpec | None = None,
                 released: moments.ReleasedMoments | None = None, shape: tuple[int, ...] | None = None,
                 t0: float | None = None, decoder: Any = None) -> Split:
    """``n`` labelled samples (balanced labels) of a run from what its sampler reads, one stream
    ``straightdp.sampling`` of ``seed``: from the release (``released``, of ``shape``: released_only), the public
    flow ``model`` started from the release's marginal at ``t0`` (guided: Sec. 3.1, "Sampling-time guidance"),
    or the trained flow ``model`` (Euler with classifier-free ``guidance``); in the latent variant decoded by the
    public autoencoder ``decoder``. The one sampler of rule sample_straightdp and of a STRAIGHTDP bundle
    (:mod:`pipeline.bundles.sample`), so a bundle redraws its run's own samples."""
    gen = seeds.torch_generator("straightdp.sampling", seed)
    if samples_from == "release":
        if released is None or shape is None:
            raise PipelineError("straightdp samples from the release: need the released moments and their shape")
        y = balanced_labels(n, released.n_classes)
        x = field_of(released).sample(y, gen).reshape(n, *shape).float()
    else:
        if model is None or spec is None or (samples_from == "guided" and (released is None or t0 is None)):
            raise PipelineError(f"straightdp samples from {samples_from}: need the flow"
                                f"{' and the released moments and t0' if samples_from == 'guided' else ''}")
        shape = (spec.channels, spec.image_size, spec.image_size)
        y = balanced_labels(n, spec.num_classes)
        if samples_from == "guided":
            # the public flow knows no private class: its null branch, steered only by the released
            # class model's marginal at t0 (the start), carries the label
            field = field_of(released)
            x = flow_samples(model, y, shape=shape, steps=steps, guidance=0.0, batch_size=batch_size, generator=gen,
                             null_label=spec.null_label, device=device,
                             start=lambda yb: guided_start(field, yb, t0=t0, generator=gen), t0=t0)
        else:
            x = flow_samples(model, y, shape=shape, steps=steps, guidance=guidance, batch_size=batch_size,
                             generator=gen, null_label=spec.null_label, device=device)
    if decoder is not None:
        from pipeline.flow import autoencoder

        images = autoencoder.decode(decoder, x.clamp(-1, 1))
    else:
        images = to_uint8(x.clamp(-1, 1))
    return Split(images, y.numpy().astype(np.int64))


@stage("sample_straightdp", optional_inputs=("model", "moments", "autoencoder"), outputs=("samples",),
       params={**COMMON_DOC, "run": "the run's name (row, total eps, seed)",
               "shape": "[C, H, W] of what the release models (images, or codes in the latent variant)",
               "precision": PRECISION_DOC})
def sample_straightdp(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Labelled samples of a run: from the release (released_only), the guided public flow (public_guidance,
    Sec. 3.1 "Sampling-time guidance"), or the trained flow. Post-processing: no ledger line."""
    cfg, _, device = _setup(params)
    run = _run(params)
    smp = cfg["sampling"]
    n = int(smp["n_samples"])
    need = {"release": ("moments",), "guided": ("model", "moments"), "model": ("model",)}[run.samples_from]
    missing = [k for k in need if k not in inputs]
    if missing:
        raise PipelineError(f"stage sample_straightdp {run.name}: needs input {missing[0]} "
                            f"(samples from {run.samples_from})")
    start = time.perf_counter()
    released = moments.ReleasedMoments.load(inputs["moments"]) if "moments" in inputs else None
    model, spec = load_flow(inputs["model"], device) if "model" in inputs else (None, None)
    precision = precision_of(params, "sample_straightdp")
    velocity = None if model is None else in_precision(model, device, precision)
    decoder = None
    if "autoencoder" in inputs:  # the latent variant: the frozen public decoder, post-processing
        from pipeline.flow import autoencoder

        decoder = autoencoder.load(inputs["autoencoder"])
    split = draw_samples(run.samples_from, n, seed=run.seed, steps=int(smp["steps"]), guidance=float(smp["guidance"]),
                         batch_size=int(smp["batch_size"]), device=device, model=velocity, spec=spec, released=released,
                         shape=tuple(int(v) for v in params["shape"]) if "shape" in params else None,
                         t0=float(cfg["guidance"]["t0"]) if run.samples_from == "guided" else None, decoder=decoder)
    save_split(outputs["samples"], split, name=run.name, source="sample_straightdp", seed=run.seed,
               extra={"row": run.row, "samples_from": run.samples_from, "wall_s": time.perf_counter() - start,
                      "steps": int(smp["steps"]), "guidance": float(smp["guidance"]), **recorded(precision)})
    log.info("sample_straightdp %s: %d samples from %s in %.1f s", run.name, n, run.samples_from,
             time.perf_counter() - start)
