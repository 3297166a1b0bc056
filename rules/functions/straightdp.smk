# STRAIGHTDP's wiring functions (rules/straightdp.smk includes this file): a run's files and params,
# the tables' inputs, its targets (costs: pipeline/resources.py). Runs: pipeline/training/straightdp_runs.py.
from pipeline.training import straightdp_runs
from pipeline.training.straightdp_runs import StraightRun

SDP = EXPDIR / "straightdp"
SDP_PUBLIC = DATA / "straightdp_public.npz"
SDP_GEOMETRY = SDP / "geometry.npz"
SDP_HORIZON = SDP / "horizon.json"
SDP_PUBLIC_FLOW = EXPDIR / "models" / "straightdp" / "public_flow.pt"
#: the tables, each written to TABLES / "straightdp_<name>.parquet" (pipeline/results/straightdp.py TABLE_METRICS)
SDP_TABLES = ("table1_main", "table5_per_class", "table6_fid_vs_eps", "table7_precision_recall", "table3_frozen")


def sdp_release_path(run):
    return SDP / "release" / f"{run}.npz"


def sdp_release_ledger(run):
    """Stage 1's own transcript per run: parallel jobs never append to the same file."""
    return EXPDIR / "ledger" / f"straightdp_release_{run}.jsonl"


def sdp_model_path(run):
    return EXPDIR / "models" / "straightdp" / f"{run}.pt"


def sdp_train_ledger(run):
    return EXPDIR / "ledger" / f"straightdp_train_{run}.jsonl"


def sdp_samples_path(run):
    return EXPDIR / "samples" / "straightdp" / f"{run}.npz"


def sdp_metrics_path(run):
    return EXPDIR / "eval" / "straightdp" / run / "metrics.json"


def sdp_runs():
    """Every run of Table 1 in the config: rows x epsilons x seeds."""
    return straightdp_runs.runs(config["straightdp"])


def sdp_run(wildcards):
    try:
        return StraightRun.from_name(wildcards.run)
    except ValueError as exc:
        raise WorkflowError(str(exc)) from None


#: keys that list which runs exist, not how one is made: left out of a job's params so that adding
#: an eps or a seed reruns nothing already built
SDP_LISTING = ("epsilons", "seeds", "rows")
#: the Fig. 6 toy's own subsection: only its rule reads it (the image runs' params and ids ignore it)
SDP_TOY_LEDGER = EXPDIR / "ledger" / "straightdp_toy.jsonl"


def sdp_toy_enabled():
    """Fig. 6 runs on data.toy: it exists only when the data stage writes the toy."""
    return bool(config["data"]["toy"]["enabled"])


#: Table 4 (composed-MNIST, the text-conditional release): its own transcript, one line per release
SDP_TABLE4_LEDGER = EXPDIR / "ledger" / "straightdp_table4_text.jsonl"


def sdp_table4_enabled():
    """Table 4 composes grey digits: on when straightdp.table4.enabled and the images are grey."""
    return bool(config["straightdp"]["table4"]["enabled"]) and cost._channels(config) == 1


def sdp_table4_claims():
    """One text release per (featurisation, eps, seed)."""
    t4 = config["straightdp"]["table4"]
    return len(t4["featurisations"]) * len(t4["epsilons"]) * len(t4["seeds"])


def sdp_toy_claims():
    """Ledger lines of the toy: per (eps, seed), one release (moments only), one DP-SGD (uniform), both (StraightDP)."""
    toy = config["straightdp"]["toy"]
    return 4 * len(toy["epsilons"]) * len(toy["seeds"])


#: the latent variant's public autoencoder and the code splits (straightdp.space: latent)
SDP_LATENT = SDP / "latent"
SDP_AUTOENCODER = SDP_LATENT / "autoencoder.pt"
#: code split name -> the image split it encodes
SDP_CODE_SOURCES = {"private_train": DATA / "private_train.npz", "straightdp_public": SDP_PUBLIC}


def sdp_latent():
    """STRAIGHTDP's latent variant: the flow, the release and DP-SGD run on the public autoencoder's codes."""
    return config["straightdp"].get("space", "pixel") == "latent"


def sdp_private_data():
    """The private split the runs see: the images, or their codes in the latent variant."""
    return SDP_LATENT / "private_train_codes.npz" if sdp_latent() else DATA / "private_train.npz"


def sdp_public_data():
    """The public split the runs see: the images, or their codes in the latent variant."""
    return SDP_LATENT / "straightdp_public_codes.npz" if sdp_latent() else SDP_PUBLIC


def sdp_sample_shape():
    """[C, H, W] of what the release models: the images, or the codes (code_channels x side/4 x side/4)."""
    side = cost._side(config)
    if sdp_latent():
        from pipeline.config import schema_defaults

        ae = {**schema_defaults("straightdp", "autoencoder"), **(config["straightdp"].get("autoencoder") or {})}
        return [ae["code_channels"], side // 4, side // 4]
    return [cost._channels(config), side, side]


#: subsections only some rules read (the toy's, Table 4's, LoRA's): left out of every other job's params
SDP_OWN_SECTIONS = ("toy", "table4", "lora")


def sdp_section(*, keep=()):
    """The straightdp section less its listing keys and the subsections of SDP_OWN_SECTIONS not in ``keep``."""
    dropped = set(SDP_LISTING + SDP_OWN_SECTIONS) - set(keep)
    return {k: v for k, v in config["straightdp"].items() if k not in dropped}


def sdp_params(*, keep=(), **extra):
    """Stage params: :func:`sdp_section` (``keep`` of its own subsections), the runtime keys, ``extra``."""
    return stage_params(straightdp=sdp_section(keep=keep), device=config["device"], threads=TORCH_THREADS,
                        **extra)


def sdp_train_params(wildcards):
    """train_straightdp's params: a LoRA row (Table 3) also reads straightdp.lora (the others' ids ignore it)."""
    return sdp_params(keep=("lora",) if sdp_run(wildcards).lora else (), run=wildcards.run)


def sdp_train_inputs(wildcards):
    run = sdp_run(wildcards)
    inputs = {"data": sdp_private_data(), "public": sdp_public_data(), "init": SDP_PUBLIC_FLOW,
              "geometry": SDP_GEOMETRY, "horizon": SDP_HORIZON}
    if run.distills:
        inputs |= {"moments": sdp_release_path(run.name), "release_ledger": sdp_release_ledger(run.name)}
    return inputs


def sdp_sample_inputs(wildcards):
    run = sdp_run(wildcards)
    inputs = {"release": {"moments": sdp_release_path(run.name)},
              "guided": {"moments": sdp_release_path(run.name), "model": SDP_PUBLIC_FLOW},
              "model": {"model": sdp_model_path(run.name)}}[run.samples_from]
    return inputs | ({"autoencoder": SDP_AUTOENCODER} if sdp_latent() else {})


def sdp_table_runs(table=None):
    """The runs a table reads (its rows: straightdp_runs.table_rows), every run for Figure 3 (table None)."""
    rows = straightdp_runs.table_rows(table) if table else straightdp_runs.ROWS
    return [run for run in sdp_runs() if run.row in rows]


def sdp_table_inputs(table=None):
    """metrics_RUN, release_RUN, train_RUN of each run of the table (or of Figure 3)."""
    out = {}
    for run in sdp_table_runs(table):
        out[f"metrics_{run.name}"] = sdp_metrics_path(run.name)
        if run.releases:
            out[f"release_{run.name}"] = sdp_release_ledger(run.name)
        if run.trains:
            out[f"train_{run.name}"] = sdp_train_ledger(run.name)
    return out


def sdp_table_params(table=None, **extra):
    s = config["straightdp"]
    extra = {**extra, "table": table} if table else extra
    return stage_params(runs=[r.name for r in sdp_table_runs(table)], epsilons=s["epsilons"], seed=SEED, **extra)


def sdp_grid_inputs():
    """Figure 5: one panel per Table 1 row at the largest eps, first seed."""
    s = config["straightdp"]
    eps, seed = max(s["epsilons"]), s["seeds"][0]
    return {row: sdp_samples_path(StraightRun(row, eps, seed).name) for row in s["rows"]}


def sdp_grid_titles():
    return {row: straightdp_runs.LABELS[row] for row in config["straightdp"]["rows"]}


def sdp_targets():
    """Tables 1, 3, 5, 6, 7 and Figures 2a, 3, 5; Figure 6 (the 2-D toy) when data.toy is on; Table 4 when on."""
    toy = ([TABLES / "straightdp_figure6_toy.parquet", FIGURES / "straightdp_figure6_toy.png"]
           if sdp_toy_enabled() else [])
    table4 = [TABLES / "straightdp_table4_text.parquet"] if sdp_table4_enabled() else []
    # a table whose rows are not configured is left out (Table 3 needs a LoRA row: guidance alone is Table 1's)
    tables = [t for t in SDP_TABLES
              if (runs := sdp_table_runs(t)) and (t != "table3_frozen" or any(r.lora for r in runs))]
    return [*(TABLES / f"straightdp_{t}.parquet" for t in tables),
            *(FIGURES / f"straightdp_{f}.png" for f in ("figure2_horizon", "figure3_accuracy", "figure5_samples")),
            *toy, *table4]


def sdp_transcripts():
    """One claim per transcript: each releasing run's Stage 1 line, each training run's Stage 2 line."""
    out = {}
    for run in sdp_runs():
        if run.releases:
            out[sdp_release_ledger(run.name)] = 1
        if run.trains:
            out[sdp_train_ledger(run.name)] = 1
    if sdp_toy_enabled():
        out[SDP_TOY_LEDGER] = sdp_toy_claims()
    if sdp_table4_enabled():
        out[SDP_TABLE4_LEDGER] = sdp_table4_claims()
    return out


def sdp_records():
    """all_runs records: every run of Table 1 (one figure line per row), its release and/or train transcript."""
    from pipeline.registry import RunRecord

    out = []
    for run in sdp_runs():
        ledgers = ((sdp_release_ledger(run.name),) if run.releases else ()) + \
                  ((sdp_train_ledger(run.name),) if run.trains else ())
        rules = (("release_moments",) if run.releases else ()) + (("train_straightdp",) if run.trains else ()) + \
                ("sample_straightdp", "evaluate_straightdp")
        out.append(RunRecord(method="straightdp", config=run.name, seed=run.seed, epsilon_target=run.epsilon,
                             metrics=sdp_metrics_path(run.name), ledgers=ledgers,
                             label=f"STRAIGHTDP: {straightdp_runs.LABELS[run.row]}",
                             benchmarks=tuple(benchmark_path(rule, run.name) for rule in rules)))
    return out
