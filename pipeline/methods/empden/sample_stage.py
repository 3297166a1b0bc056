"""Stage ``empden_sample``: one cell of the EMPDEN grid -> a split of samples and its ledger line.

A cell (:class:`pipeline.methods.empden.grid.Cell`) names the sampler and its symbols; the
schedule, clip norm C and the accountant settings come from the config's ``accounting``
section, so the eps a cell claims in its ledger is the eps the accounting tables compute for
the same (mu_bar_B, q_B, N_out). The samplers are :mod:`pipeline.sampling.empirical`:

* ``hybrid`` / ``per_step``: :func:`~pipeline.sampling.empirical.sample_hybrid` (Algorithm 1 /
  Prop. C.1) on the N-step grid (EMPDEN: N = 39), public denoiser from t1 = t_{k-T} to 0;
* ``full_batch``: :func:`~pipeline.sampling.empirical.sample_full_batch` on the N_full_batch-step
  grid (EMPDEN: 50) ending at the cell's sigma_min (Sec. 6.1, Figure 4);
* ``public_only``: the public denoiser alone (EDM Heun over the N-step grid): no private data
  is read, no ledger line, eps = 0 (reference row of Table 2).

The empirical denoiser's normaliser (params ``normaliser``): ``constant`` is EMPDEN eq. 38
literally (divide by beta |S| only), which is inert at image dimensions (the kernel values are
~1e-54 or smaller at d = 256, so E_hat = 0); ``public_marginal`` also divides by
p_hat_pub(x_t) over the public split (``--in public_data=PATH``, optionally a fixed random subset
of ``normaliser_n`` records), i.e. eq. 37 with its normaliser estimated on public data. It costs
no privacy (see :mod:`pipeline.privacy.empirical_denoiser`): ledger lines and eps are unchanged.

Images are mapped to [-1, 1] (the public denoiser's scale) and back to uint8 with clipping.
Samples are unconditional: every label is -1, which the evaluation stage scores in
FID/KID/precision-recall and leaves out of the label-aware metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from pipeline import seeds, shards
from pipeline.device import resolve_device
from pipeline.images import to_uint8 as images_to_uint8
from pipeline.images import to_unit_scale
from pipeline.io import Split, atomic_path, load_split, read_manifest, save_split
from pipeline.methods.empden.grid import Cell
from pipeline.models.precision import PARAM_DOC as PRECISION_DOC
from pipeline.models.precision import in_precision, precision_of
from pipeline.privacy import accountants as acc
from pipeline.privacy import empirical_denoiser as emp
from pipeline.privacy import ledger
from pipeline.privacy.empden_block import EmpdenBlock
from pipeline.sampling import empirical as empden
# what a cell's (and Figure 2's) run releases, from the configuration: the wiring registers the same blocks
from pipeline.methods.empden.plan import cell_block, figure2_blocks, figure2_rows, job_outputs, schedule_of
from pipeline.stage import PipelineError, numbered, stage
from pipeline.training.data import manifest_sha256

log = logging.getLogger(__name__)

#: label of an unconditional sample (pipeline.evaluation.stage: negative = no label)
UNCONDITIONAL = -1
#: seconds between progress lines in a job's log (a line per batch when batches are slower)
PROGRESS_INTERVAL_S = 30.0

PARAMS_DOC = {
    "cell": "the cell: {method, seed, beta, p_percent, B, T, sigma_min} (pipeline.methods.empden.grid.Cell)",
    "accounting": "the config's `accounting` section: schedule (sigma_min/max, rho, N, N_full_batch), C, "
                  "C_scales_with_subset, delta, discretisation, log_mass_truncation",
    "n_out": "number of samples to release (the N_out the ledger line accounts for)",
    "batch_size": "outputs sampled at once (memory only; default 256)",
    "normaliser": "constant (eq. 38 literally) | public_marginal (Z = p_hat_pub(x_t) over --in public_data; "
                  "default constant)",
    "normaliser_n": "public records used by public_marginal: a fixed random subset of this size (null = all)",
    "device": "auto | cpu | cuda[:N]",
    "threads": "torch CPU threads (default 1)",
    "config_id": "id of the configuration (ledger and manifest provenance)",
    "ledger_binding": "{run, experiment} the cell's ledger line is bound to (the replay checks them against the "
                      "registry)",
    "precision": PRECISION_DOC + "; the public denoiser's only: the private block is float64 always",
}


def to_model_scale(images: np.ndarray) -> torch.Tensor:
    """uint8 [N, C, H, W] -> float64 in [-1, 1] (the scale of the public EDM denoiser, sigma_data = 0.5)."""
    return to_unit_scale(images, torch.float64)


def to_uint8(x: torch.Tensor) -> np.ndarray:
    """[-1, 1] -> uint8 with clipping (a state still at noise level sigma_min > 0 leaves [-1, 1])."""
    return images_to_uint8(x, torch.float64)


#: seed of the fixed random subset of public records behind the public-marginal normaliser: a
#: constant, so every cell (and seed) divides by the same public Z.
NORMALISER_SUBSET_SEED = 0


def public_normaliser_data(params: Mapping[str, Any], path: Path | None, *,
                           shape: tuple[int, ...]) -> torch.Tensor | None:
    """The public records of the ``public_marginal`` normaliser in model scale, or None for ``constant``.

    ``normaliser_n`` keeps a fixed random subset (seed NORMALISER_SUBSET_SEED) to bound the cost of
    Z at paper scale (one [outputs, m] kernel matrix per step).
    """
    kind = params.get("normaliser", "constant")
    if kind not in emp.NORMALISERS:
        raise PipelineError(f"config error at empden.normaliser: must be one of {', '.join(emp.NORMALISERS)}, got {kind!r}")
    if kind == "constant":
        return None
    if path is None:
        raise PipelineError("empden.normaliser public_marginal needs the public split (--in public_data=PATH)")
    public = load_split(path)
    if tuple(public.images.shape[1:]) != shape:
        raise PipelineError(f"input public_data: {path} has images "
                            f"{'x'.join(map(str, public.images.shape[1:]))}, the private images are "
                            f"{'x'.join(map(str, shape))}")
    data = to_model_scale(public.images)
    m = params.get("normaliser_n")
    if m is not None and int(m) < data.shape[0]:
        if int(m) < 1:
            raise PipelineError(f"config error at empden.normaliser_n: must be >= 1, got {m}")
        subset = seeds.torch_generator("empden.normaliser_subset", NORMALISER_SUBSET_SEED)
        keep = torch.randperm(data.shape[0], generator=subset)
        data = data[keep[: int(m)]]
    return data


def _public_denoiser(path: Path | None, *, shape: tuple[int, ...], device: torch.device) -> empden.PublicDenoiser:
    from pipeline.models.checkpoint import load_denoiser

    if path is None:
        raise PipelineError("empden_sample: this method needs the public denoiser (--in public=PATH)")
    net = load_denoiser(path, device=device, convention="ve_sigma")  # EDM Heun's D(x; sigma)
    cfg = getattr(getattr(net, "unet", None), "config", None)
    if cfg is not None and (cfg.in_channels, cfg.sample_size) != (shape[0], shape[1]):
        raise PipelineError(f"empden_sample: public denoiser {path} is for {cfg.in_channels}x{cfg.sample_size}"
                            f"x{cfg.sample_size} images, the private images are {'x'.join(map(str, shape))}")

    # EMPDEN's samples are unconditional. A class-conditional public denoiser trained with label
    # dropout (classifier-free guidance) has a null label, the extra last embedding row
    # (pipeline.models.unet.UNetSpec): ask it the unconditional question with that label.
    n_embeds = getattr(cfg, "num_class_embeds", None) if cfg is not None else None
    null_label = None if not n_embeds else n_embeds - 1

    def denoise(x: torch.Tensor, sigma: float) -> torch.Tensor:
        if null_label is None:
            return net(x, sigma)
        return net(x, sigma, torch.full((x.shape[0],), null_label, dtype=torch.long, device=x.device))

    return denoise


def chunk_generators(cell: Cell, *, first_chunk: int = 0,
                     device: torch.device | str = "cpu") -> empden.Generators:
    """The generator of each batch of a cell's run, keyed by the batch's index in the run (``first_chunk`` +
    its index in this job): a batch draws the same numbers whichever shard samples it (pipeline.shards)."""
    return lambda c: seeds.torch_generator("empden.chunk", cell.seed, first_chunk + c, device=device)


def run_cell(cell: Cell, *, private: Split | None, public: empden.PublicDenoiser | None, shape: tuple[int, ...],
             accounting: Mapping[str, Any], n_out: int, sink: emp.LedgerSink | None, device: torch.device,
             batch_size: int = 256, public_data: torch.Tensor | None = None,
             progress: empden.Progress | None = None, first_chunk: int = 0) -> tuple[torch.Tensor, dict[str, Any]]:
    """Sample ``n_out`` outputs of ``cell``; return them in [-1, 1] scale and the cell's privacy facts.

    The facts (k, t0, t1, n, q_B, mu_bar_B, C used, normaliser) go into the samples' manifest, so
    the tables can recompute every eps from the cell alone. ``public_data`` (model scale): the
    records of the public-marginal normaliser, None for eq. 38's constant one. ``progress`` is
    called with the number of outputs each finished batch added. ``first_chunk``: the index in the
    cell's run of this call's first batch of ``batch_size`` outputs (a shard's; 0 for the whole run).
    """
    gen = chunk_generators(cell, first_chunk=first_chunk, device=device)
    sched = schedule_of(cell, accounting)
    facts: dict[str, Any] = {**cell.as_dict(), "n_out": n_out, "N": sched.N, "sigma_max": sched.sigma_max,
                             "rho": sched.rho, "sigma_min_schedule": sched.sigma_min,
                             "normaliser": "constant" if public_data is None else "public_marginal",
                             "normaliser_n": None if public_data is None else int(public_data.shape[0])}
    if cell.method == "public_only":
        chunks = []
        for c, start in enumerate(range(0, n_out, batch_size)):
            b = min(batch_size, n_out - start)
            x = sched.sigma_max * torch.randn((b, *shape), generator=gen(c), device=device)
            chunks.append(empden.edm_heun(x, public, sched.times()))
            if progress is not None:
                progress(b)
        out = torch.cat(chunks)
        # no empirical denoiser runs, so no normaliser either
        return out, {**facts, "k_steps": 0, "n": None, "q_B": 0.0, "mu_bar_B": 0.0, "normaliser": None,
                     "normaliser_n": None}
    assert private is not None and sink is not None
    data = to_model_scale(private.images)
    n = data.shape[0]
    if cell.method == "full_batch":
        block = cell_block(cell, accounting, n=n, n_out=n_out)
        out = empden.sample_full_batch(data, n_out=n_out, C=block.C_eff, beta=block.beta, sink=sink, generator=gen,
                                       schedule=block.schedule, batch_size=batch_size, public_data=public_data,
                                       progress=progress)
        return out, {**facts, **block.facts()}
    if cell.B > n:
        raise PipelineError(f"empden_sample: subsample size B={cell.B} exceeds the private set size n={n}")
    try:
        _, _, t1 = empden.hybrid_times(sched, cell.p_percent, cell.T)
    except ValueError as exc:
        raise PipelineError(f"empden_sample {cell.name}: {exc}") from None
    block = cell_block(cell, accounting, n=n, n_out=n_out)
    out = empden.sample_hybrid(data, n_out=n_out, B=block.B, p_percent=cell.p_percent, T=cell.T,
                               public_denoiser=public, C=block.C_eff, beta=block.beta, sink=sink, generator=gen,
                               schedule=block.schedule, resample=block.scheme, batch_size=batch_size,
                               public_data=public_data, progress=progress)
    return out, {**facts, **block.facts(), "t1": t1}


def _pld_sink(accounting: Mapping[str, Any], **kwargs: Any) -> emp.LedgerSink:
    """A cell's ledger sink with the accounting section's delta and PLD grid."""
    return emp.LedgerSink(stage="empden_sample", delta=float(accounting["delta"]),
                          pld=acc.PLDSettings(float(accounting["discretisation"]),
                                              float(accounting["log_mass_truncation"])), **kwargs)


def _cell_of(params: Mapping[str, Any], stage_name: str) -> Cell:
    try:
        return Cell(**{k: v for k, v in params["cell"].items() if k != "cell"})
    except (KeyError, TypeError, ValueError) as exc:
        raise PipelineError(f"{stage_name}: bad params.cell ({exc})") from None


def _run_size(params: Mapping[str, Any], stage_name: str) -> tuple[int, int]:
    """(n_out, batch_size) of the cell's whole run, checked."""
    n_out, batch_size = int(params.get("n_out", 0)), int(params.get("batch_size", 256))
    if n_out < 1:
        raise PipelineError(f"{stage_name}: n_out must be >= 1, got {n_out}")
    if batch_size < 1:
        raise PipelineError(f"{stage_name}: batch_size must be >= 1, got {batch_size}")
    return n_out, batch_size


@stage("empden_sample", inputs=("private",), outputs=("samples",), optional_inputs=("public", "public_data"),
       optional_outputs=("ledger",),
       params={**PARAMS_DOC, "shard": "{index, of}: sample only this shard's batches of the cell's n_out "
                                      "(pipeline.shards; absent: the whole run)"})
def empden_sample(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """One EMPDEN cell (hybrid, per_step, full_batch or public_only), or one shard of it: samples as a split, one
    ledger line."""
    cell = _cell_of(params, "empden_sample")
    accounting = params.get("accounting")
    if not accounting:
        raise PipelineError("empden_sample: params need the config's `accounting` section")
    n_run, batch_size = _run_size(params, "empden_sample")
    try:
        shard = shards.shard_of(params.get("shard"))
        start, stop = (0, n_run) if shard is None else shard.outputs(n_run, batch_size)
    except ValueError as exc:
        raise PipelineError(f"empden_sample: {exc}") from None
    n_out = stop - start
    torch.set_num_threads(int(params.get("threads", 1)))
    device = resolve_device(params.get("device", "auto"))
    config_id = str(params.get("config_id", "unknown"))
    private = load_split(inputs["private"])
    shape = tuple(private.images.shape[1:])
    public_data = None
    if cell.private:
        public_data = public_normaliser_data(params, inputs.get("public_data"), shape=shape)
    public = None
    if cell.method != "full_batch":
        public = in_precision(_public_denoiser(inputs.get("public"), shape=shape, device=device), device,
                              precision_of(params, "empden_sample"))
    sink = None
    shard_facts = {} if shard is None else {"shard": {**shard.as_dict(), "outputs": [start, stop]}}
    if cell.private:
        if "ledger" not in outputs:
            raise PipelineError(f"empden_sample: a {cell.method} cell reads private data and needs --out ledger=PATH")
        # A rerun replaces the cell's transcript: it describes the samples this run writes.
        Path(outputs["ledger"]).unlink(missing_ok=True)
        # a shard's line is line `index` of the cell's transcript (its gather joins them in order)
        sink = _pld_sink(accounting, path=Path(outputs["ledger"]), config_id=config_id, seed=cell.seed,
                         binding=ledger.binding_of(params, stage="empden_sample",
                                                   data_sha256=manifest_sha256(inputs["private"], "private")),
                         first_seq=0 if shard is None else shard.index, extra=shard_facts)
    log.info("empden_sample %s: outputs [%d, %d) of %d on %s", cell.name, start, stop, n_run, device)
    # A paper-scale cell samples for hours: the bar (stderr, i.e. the job's log) shows outputs
    # done, elapsed time and the ETA after every batch, at most every PROGRESS_INTERVAL_S seconds.
    with tqdm(total=n_out, desc=f"empden_sample {cell.name}", unit="img", mininterval=PROGRESS_INTERVAL_S) as bar:
        x, facts = run_cell(cell, private=private if cell.private else None, public=public, shape=shape,
                            accounting=accounting, n_out=n_out, sink=sink, device=device,
                            batch_size=batch_size, public_data=public_data, progress=bar.update,
                            first_chunk=start // batch_size)
    if sink is not None:
        entries = [e for _, e in ledger.read_ledger(sink.path)]
        facts["claimed_epsilon"] = entries[-1].claimed_epsilon
        facts["delta"] = entries[-1].delta
        log.info("%s: claimed eps_u = %.4g at delta = %g", cell.name, facts["claimed_epsilon"], facts["delta"])
    else:
        facts["claimed_epsilon"], facts["delta"] = 0.0, float(accounting["delta"])
    images = to_uint8(x.reshape(n_out, *shape))
    save_split(outputs["samples"], Split(images, np.full(n_out, UNCONDITIONAL, dtype=np.int64)),
               name=f"empden_{cell.name}", source="empden_sample", seed=cell.seed,
               extra={"empden": {**facts, **shard_facts}, "config_id": config_id})


#: the facts of a cell's manifest that depend on how many outputs a job drew (its gather states them for the cell)
PER_OUTPUTS_FACTS = ("n_out", "claimed_epsilon", "mu_total")


def _check_shard_facts(path: Path, facts: Mapping[str, Any], first: Mapping[str, Any], index: int, of: int,
                       expected: tuple[int, int]) -> None:
    shard = facts.get("shard")
    if shard != {"index": index, "of": of, "outputs": list(expected)}:
        raise PipelineError(f"empden_gather: {path} is {shard!r}, expected shard {index} of {of} with outputs "
                            f"{list(expected)} (a shard of another run, or of another sampling.shards)")
    differ = sorted(k for k in set(facts) | set(first)
                    if k not in ("shard", *PER_OUTPUTS_FACTS) and facts.get(k) != first.get(k))
    if differ:
        raise PipelineError(f"empden_gather: {path} differs from shard 0 in {', '.join(differ)} (shards of one "
                            f"cell share everything but their outputs)")


@stage("empden_gather", numbered_inputs=("shard", "ledger"), outputs=("samples",), optional_outputs=("ledger",),
       params={k: PARAMS_DOC[k] for k in ("cell", "accounting", "n_out", "batch_size", "config_id")})
def empden_gather(inputs: Mapping[str, Path], outputs: Mapping[str, Path], params: Mapping[str, Any]) -> None:
    """Join a sharded cell: shard_0 .. shard_<S-1> (samples) and, for a private cell, ledger_0 .. (their
    transcripts) -> the cell's samples and its transcript of S lines, as an unsharded run writes them.

    The samples are the shards' in order (bit-equal to one job's: :mod:`pipeline.shards`); the
    transcript is the shards' lines, each written by its own shard as line ``index`` of the cell's
    (nothing here writes a claim). The manifest's ``claimed_epsilon`` is the whole block's over all
    ``n_out`` outputs under the same accountant, the value the unsharded job claims (composing the S
    lines gives it too: :func:`pipeline.privacy.certify.composed_entry`).
    """
    cell = _cell_of(params, "empden_gather")
    accounting = params.get("accounting")
    if not accounting:
        raise PipelineError("empden_gather: params need the config's `accounting` section")
    n_run, batch_size = _run_size(params, "empden_gather")
    parts = numbered(inputs, "shard", "empden_gather")
    of = len(parts)
    try:
        ranges = job_outputs(n_run, batch_size, of)
    except ValueError as exc:
        raise PipelineError(f"empden_gather: {exc}") from None
    splits, facts_of = [], []
    for i, path in enumerate(parts):
        splits.append(load_split(path))
        facts_of.append(read_manifest(path).get("empden", {}))
        _check_shard_facts(path, facts_of[i], facts_of[0], i, of, ranges[i])
        if len(splits[i]) != ranges[i][1] - ranges[i][0]:
            raise PipelineError(f"empden_gather: {path} holds {len(splits[i])} samples, its shard {ranges[i]}")
    facts = {k: v for k, v in facts_of[0].items() if k != "shard"}
    if {k: facts.get(k) for k in cell.as_dict()} != cell.as_dict():
        raise PipelineError(f"empden_gather: {parts[0]} is a shard of cell {facts.get('cell')!r}, not {cell.name!r}")
    facts["n_out"] = n_run
    if cell.private:
        if "ledger" not in outputs:
            raise PipelineError(f"empden_gather: a {cell.method} cell reads private data and needs --out ledger=PATH")
        transcripts = numbered(inputs, "ledger", "empden_gather")
        if len(transcripts) != of:
            raise PipelineError(f"empden_gather: {of} shards but {len(transcripts)} transcripts (ledger_0 ..)")
        lines = b""
        for i, path in enumerate(transcripts):
            entries = list(ledger.read_ledger(path))
            if len(entries) != 1 or entries[0][1].seq != i or entries[0][1].count != ranges[i][1] - ranges[i][0]:
                raise PipelineError(f"empden_gather: {path} must hold shard {i}'s one line (seq {i}, count "
                                    f"{ranges[i][1] - ranges[i][0]})")
            lines += path.read_bytes()
        with atomic_path(outputs["ledger"]) as tmp:
            tmp.write_bytes(lines)
        block = EmpdenBlock.from_facts(facts)
        facts.update(block.facts())
        facts["claimed_epsilon"], _ = emp.claim_epsilon(
            _pld_sink(accounting, path=Path(outputs["ledger"]), config_id="", seed=cell.seed), block)
        log.info("%s: %d shards joined; the cell claims eps_u = %.4g at delta = %g", cell.name, of,
                 facts["claimed_epsilon"], facts["delta"])
    images = np.concatenate([s.images for s in splits])
    labels = np.concatenate([s.labels for s in splits])
    save_split(outputs["samples"], Split(images, labels), name=f"empden_{cell.name}", source="empden_sample",
               seed=cell.seed, extra={"empden": facts, "config_id": str(params.get("config_id", "unknown"))})


def trajectories(private: Split, public: empden.PublicDenoiser, *, p_percent: float, B: int, T: int, beta: float,
                 accounting: Mapping[str, Any], n_rows: int, seed: int, sink: emp.LedgerSink,
                 device: torch.device, public_data: torch.Tensor | None = None
                 ) -> dict[str, list[tuple[float, torch.Tensor]]]:
    """Every state of ``n_rows`` Algorithm-1 trajectories, output-wise and per-step, from identical noise.

    EMPDEN Figure 2: the same initial noise (the generator is reseeded per scheme and the
    initial state is its first draw, as in :func:`~pipeline.sampling.empirical.sample_hybrid`),
    then the private block with one B-subset reused (``per_output``) or a fresh one per step
    (``per_step``), the re-noising to t1 and the public denoiser to 0. Showing the states is a
    release of its own: both runs are recorded in ``sink`` (Prop. 4.1 and Prop. C.1) first.
    ``public_data``: records of the public-marginal normaliser (None: eq. 38's constant).
    Returns scheme -> [(noise level, state [n_rows, C, H, W] in [-1, 1] scale), ...].
    """
    shape = tuple(private.images.shape[1:])
    prep = emp.prepare_records(to_model_scale(private.images), device=device)
    pub = empden.prepare_public(public_data, prep)
    normaliser = "constant" if pub is None else "public_marginal"
    if B > prep.n:
        raise PipelineError(f"empden figure 2: subsample size B={B} exceeds the private set size n={prep.n}")
    blocks = figure2_blocks({"p": p_percent, "B": B, "T": T, "n_rows": n_rows}, accounting, beta=beta, seed=seed,
                            n=prep.n)
    sched = blocks["per_output"].schedule
    try:
        k, t0, t1 = empden.hybrid_times(sched, p_percent, T)
    except ValueError as exc:
        raise PipelineError(f"empden figure 2: {exc}") from None
    for block in blocks.values():
        emp.record_block(sink, block, normaliser=normaliser)
    C = blocks["per_output"].C_eff
    times = sched.times()
    out: dict[str, list[tuple[float, torch.Tensor]]] = {}
    for scheme in ("per_output", "per_step"):
        gen = seeds.torch_generator("empden.figure2", seed, device=device)
        x = sched.sigma_max * torch.randn((n_rows, prep.d), generator=gen, device=device, dtype=prep.x0.dtype)
        states = [(float(times[0]), x.reshape(n_rows, *shape).float())]
        subset = emp.draw_subsets(prep.n, B, n_rows, generator=gen, device=device) if scheme == "per_output" else None
        for i in range(k):
            s = subset if subset is not None else emp.draw_subsets(prep.n, B, n_rows, generator=gen, device=device)
            log_z = None if pub is None else emp.log_public_marginal(x, pub, float(times[i]))
            x = emp.private_step(x, prep, float(times[i]), float(times[i + 1]), C=C, beta=beta, subset=s,
                                 generator=gen, log_normaliser=log_z)
            states.append((float(times[i + 1]), x.reshape(n_rows, *shape).float()))
        x = empden.renoise(x, t0, t1, generator=gen).reshape(n_rows, *shape).float()
        states.append((t1, x))
        for i in range(k - T, sched.N):
            x = empden.edm_heun(x, public, times[i:i + 2])
            states.append((float(times[i + 1]), x))
        out[scheme] = states
    return out


@stage("empden_figure2_trajectories", inputs=("private", "public"), outputs=("figure", "ledger"),
       optional_inputs=("public_data",),
       params={"figure2": "the config's empden.figure2 ({p, B, T, n_rows, n_columns})",
               "beta": "public normaliser (accounting.beta)", "seed": "generation seed (identical initial noise)",
               **{k: PARAMS_DOC[k] for k in ("normaliser", "normaliser_n")},
               **{k: PARAMS_DOC[k] for k in ("accounting", "device", "threads", "config_id", ledger.BINDING_PARAM)}})
def empden_figure2_trajectories(inputs: Mapping[str, Path], outputs: Mapping[str, Path],
                                params: Mapping[str, Any]) -> None:
    """EMPDEN Figure 2: output-wise vs per-step subsampling from identical initial noise (rows = samples,
    columns = decreasing noise levels); its own ledger lines."""
    import matplotlib.pyplot as plt

    from pipeline.reporting import save_figure

    f2, accounting = params.get("figure2"), params.get("accounting")
    if not f2 or not accounting:
        raise PipelineError("empden_figure2_trajectories: params need figure2 and accounting")
    torch.set_num_threads(int(params.get("threads", 1)))
    device = resolve_device(params.get("device", "auto"))
    private = load_split(inputs["private"])
    shape = tuple(private.images.shape[1:])
    public = _public_denoiser(inputs["public"], shape=shape, device=device)
    seed, n_rows, n_cols = int(params.get("seed", 0)), figure2_rows(f2), int(f2.get("n_columns", 8))
    Path(outputs["ledger"]).unlink(missing_ok=True)
    sink = emp.LedgerSink(path=Path(outputs["ledger"]), stage="empden_figure2_trajectories",
                          config_id=str(params.get("config_id", "unknown")), seed=seed,
                          delta=float(accounting["delta"]),
                          pld=acc.PLDSettings(float(accounting["discretisation"]),
                                              float(accounting["log_mass_truncation"])),
                          binding=ledger.binding_of(params, stage="empden_figure2_trajectories",
                                                    data_sha256=manifest_sha256(inputs["private"], "private")))
    traj = trajectories(private, public, p_percent=float(f2["p"]), B=int(f2["B"]), T=int(f2["T"]),
                        beta=float(params.get("beta", accounting["beta"])), accounting=accounting, n_rows=n_rows,
                        seed=seed, sink=sink, device=device,
                        public_data=public_normaliser_data(params, inputs.get("public_data"), shape=shape))
    fig, axes = plt.subplots(1, 2, figsize=(2 * n_cols * 0.8 + 1, n_rows * 0.8 + 0.8))
    for ax, (scheme, title) in zip(axes, (("per_output", "(a) output-wise"), ("per_step", "(b) per-step"))):
        states = traj[scheme]
        idx = np.unique(np.linspace(0, len(states) - 1, n_cols).round().astype(int))
        grid = np.concatenate([np.concatenate(list(to_uint8(states[i][1])), axis=1) for i in idx], axis=2)
        ax.imshow(grid[0] if grid.shape[0] == 1 else grid.transpose(1, 2, 0), cmap="gray", vmin=0, vmax=255)
        side = shape[-1]
        ax.set_xticks([side * (j + 0.5) for j in range(len(idx))], [f"{states[i][0]:.3g}" for i in idx], fontsize=6)
        ax.set_yticks([])
        ax.set_xlabel("noise level sigma")
        ax.set_title(f"{title}, B = {f2['B']}, p = {f2['p']}%, T = {f2['T']}", fontsize=8)
    save_figure(fig, outputs["figure"])
