# STRAIGHTDP's wiring functions (rules/straightdp.smk includes this file): a run's files and params,
# the tables' inputs, its targets (costs: pipeline/resources.py). Runs: pipeline/training/straightdp_runs.py.
from pipeline.training import straightdp_runs
from pipeline.training.straightdp_runs import StraightRun

SDP = EXPDIR / "straightdp"
SDP_PUBLIC = DATA / "straightdp_public.npz"
SDP_GEOMETRY = SDP / "geometry.npz"
SDP_HORIZON = SDP / "horizon.json"
SDP_PUBLIC_FLOW = EXPDIR / "models" / "straightdp" / "public_flow.pt"
#: an arm's own files (straightdp.arms: in another space its autoencoder, codes, geometry; its public flow is
#: under models/, :func:`sdp_public_flow`)
SDP_ARMS = SDP / "arms"
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


def sdp_train_metrics(run):
    """The training run's metrics JSON (its gradient-norm log: Table 2's tail ratio)."""
    return EXPDIR / "train" / "straightdp" / f"{run}.json"


def sdp_runs():
    """Every run of Table 1 in the config: rows x epsilons x seeds."""
    return straightdp_runs.runs(config["straightdp"])


def sdp_arm_runs(table=None):
    """Every arm's runs (straightdp.arms), or those of the arms that feed ``table``."""
    return straightdp_runs.arm_runs(config["straightdp"], table)


def sdp_table2_runs(panel):
    """Table 2's runs: the arms of table2_<panel>, then each arm run's main-configuration twin (the reference)."""
    arm = sdp_arm_runs(f"table2_{panel}")
    return [*arm, *dict.fromkeys(run.main for run in arm)]


def sdp_table2_panels():
    """The Table 2 panels some arm feeds (the noise sweep needs exactly one constrained arm: the stage says so)."""
    return [p for p in ("noise_sweep", "ablation") if sdp_arm_runs(f"table2_{p}")]


def sdp_run(wildcards):
    try:
        return StraightRun.from_name(wildcards.run)
    except ValueError as exc:
        raise WorkflowError(str(exc)) from None


#: keys that list which runs exist, not how one is made: left out of a job's params so that adding
#: an eps, a seed or an arm reruns nothing already built
SDP_LISTING = ("epsilons", "seeds", "rows", "arms")
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


def sdp_arm_section(arm=""):
    """The straightdp section an arm's jobs read (straightdp_runs.arm_section; "" = the main configuration)."""
    try:
        return straightdp_runs.arm_section(config["straightdp"], arm)
    except ValueError as exc:
        raise WorkflowError(str(exc)) from None


def sdp_latent(arm=""):
    """STRAIGHTDP's latent variant: the flow, the release and DP-SGD run on the public autoencoder's codes."""
    return sdp_arm_section(arm).get("space", "pixel") == "latent"


def sdp_own_geometry(arm):
    """An arm in latent space (its own autoencoder), or a pixel arm of a latent configuration, has its own
    release geometry and horizon; any other arm shares the main one's (they read the same public split)."""
    return bool(arm) and (sdp_latent(arm) or sdp_latent())


def sdp_latent_dir(arm=""):
    return SDP_ARMS / arm / "latent" if arm else SDP_LATENT


def sdp_arm_geometry(arm):
    """An arm's own release geometry and horizon (``arm`` may be the rule wildcard "{arm}")."""
    return SDP_ARMS / arm / "geometry.npz", SDP_ARMS / arm / "horizon.json"


def sdp_autoencoder(arm=""):
    return sdp_latent_dir(arm) / "autoencoder.pt"


def sdp_geometry(arm=""):
    return sdp_arm_geometry(arm)[0] if sdp_own_geometry(arm) else SDP_GEOMETRY


def sdp_horizon(arm=""):
    return sdp_arm_geometry(arm)[1] if sdp_own_geometry(arm) else SDP_HORIZON


def sdp_public_flow(arm=""):
    """The public flow a run starts from (or is guided on): the main one, or the arm's (its backbone, its space);
    ``arm`` may be the rule wildcard "{arm}"."""
    return EXPDIR / "models" / "straightdp" / "arms" / arm / "public_flow.pt" if arm else SDP_PUBLIC_FLOW


def sdp_private_data(arm=""):
    """The private split the runs see: the images, or their codes in the latent variant."""
    return sdp_latent_dir(arm) / "private_train_codes.npz" if sdp_latent(arm) else DATA / "private_train.npz"


def sdp_public_data(arm=""):
    """The public split the runs see: the images, or their codes in the latent variant."""
    return sdp_latent_dir(arm) / "straightdp_public_codes.npz" if sdp_latent(arm) else SDP_PUBLIC


def sdp_sample_shape(arm=""):
    """[C, H, W] of what the release models: the images, or the codes (code_channels x side/4 x side/4)."""
    side = cost._side(config)
    if sdp_latent(arm):
        from pipeline.config import schema_defaults

        ae = {**schema_defaults("straightdp", "autoencoder"), **(sdp_arm_section(arm).get("autoencoder") or {})}
        return [ae["code_channels"], side // 4, side // 4]
    return [cost._channels(config), side, side]


#: subsections only some rules read (the toy's, Table 4's, LoRA's): left out of every other job's params
SDP_OWN_SECTIONS = ("toy", "table4", "lora")


def sdp_section(*, keep=(), arm=""):
    """The straightdp section (an arm's: :func:`sdp_arm_section`) less its listing keys and the subsections
    of SDP_OWN_SECTIONS not in ``keep``."""
    dropped = set(SDP_LISTING + SDP_OWN_SECTIONS) - set(keep)
    return {k: v for k, v in sdp_arm_section(arm).items() if k not in dropped}


def sdp_params(*, keep=(), arm="", **extra):
    """Stage params: :func:`sdp_section` (``keep`` of its own subsections), the runtime keys, ``extra``."""
    return stage_params(straightdp=sdp_section(keep=keep, arm=arm), device=config["device"], threads=TORCH_THREADS,
                        **extra)


def sdp_run_params(wildcards, *, train=False, **extra):
    """A run's job params: its arm's section; a LoRA row's training (Table 3) also reads straightdp.lora (no
    other job's id moves with it)."""
    run = sdp_run(wildcards)
    return sdp_params(keep=("lora",) if train and run.lora else (), arm=run.arm, run=run.name, **extra)


def sdp_release_inputs(wildcards):
    arm = sdp_run(wildcards).arm
    return {"data": sdp_private_data(arm), "geometry": sdp_geometry(arm)}


def sdp_train_inputs(wildcards):
    run = sdp_run(wildcards)
    inputs = {"data": sdp_private_data(run.arm), "public": sdp_public_data(run.arm), "init": sdp_public_flow(run.arm),
              "geometry": sdp_geometry(run.arm), "horizon": sdp_horizon(run.arm)}
    if run.distills:
        inputs |= {"moments": sdp_release_path(run.name), "release_ledger": sdp_release_ledger(run.name)}
    return inputs


def sdp_sample_inputs(wildcards):
    run = sdp_run(wildcards)
    inputs = {"release": {"moments": sdp_release_path(run.name)},
              "guided": {"moments": sdp_release_path(run.name), "model": sdp_public_flow(run.arm)},
              "model": {"model": sdp_model_path(run.name)}}[run.samples_from]
    return inputs | ({"autoencoder": sdp_autoencoder(run.arm)} if sdp_latent(run.arm) else {})


def sdp_table_runs(table=None):
    """The runs a table reads (its rows: straightdp_runs.table_rows), every run for Figure 3 (table None);
    Table 1 also the runs of the arms that feed it (its latent block, its low-B0 row)."""
    rows = straightdp_runs.table_rows(table) if table else straightdp_runs.ROWS
    arms = sdp_arm_runs(table) if table == "table1_main" else []
    return [run for run in sdp_runs() if run.row in rows] + arms


def sdp_run_inputs(runs, *, grad=False):
    """metrics_RUN, release_RUN, train_RUN of each run (and grad_RUN, its training metrics, when ``grad``)."""
    out = {}
    for run in runs:
        out[f"metrics_{run.name}"] = sdp_metrics_path(run.name)
        if run.releases:
            out[f"release_{run.name}"] = sdp_release_ledger(run.name)
        if run.trains:
            out[f"train_{run.name}"] = sdp_train_ledger(run.name)
            if grad:
                out[f"grad_{run.name}"] = sdp_train_metrics(run.name)
    return out


def sdp_table_inputs(table=None):
    """The inputs of a table (or of Figure 3): :func:`sdp_run_inputs` of its runs."""
    return sdp_run_inputs(sdp_table_runs(table))


def sdp_table_params(table=None, **extra):
    runs = sdp_table_runs(table)
    extra = {**extra, "table": table} if table else extra
    # the main grid's budgets in its order, then any only an arm ran
    epsilons = list(dict.fromkeys([*config["straightdp"]["epsilons"], *(r.epsilon for r in runs)]))
    return stage_params(runs=[r.name for r in runs], epsilons=epsilons, seed=SEED, **extra)


def sdp_grid_inputs():
    """Figure 5: one panel per Table 1 row at the largest eps, first seed."""
    s = config["straightdp"]
    eps, seed = max(s["epsilons"]), s["seeds"][0]
    return {row: sdp_samples_path(StraightRun(row, eps, seed).name) for row in s["rows"]}


def sdp_grid_titles():
    return {row: straightdp_runs.LABELS[row] for row in config["straightdp"]["rows"]}


def sdp_all_runs():
    """Every run ``all`` builds: the main grid, the arms', Table 2's references (main twins) not in the grid."""
    twins = [run.main for panel in sdp_table2_panels() for run in sdp_arm_runs(f"table2_{panel}")]
    return list(dict.fromkeys([*sdp_runs(), *sdp_arm_runs(), *twins]))


def sdp_targets():
    """Tables 1, 2, 3, 5, 6, 7 and Figures 2a, 3, 5; Figure 6 (the 2-D toy) when data.toy is on; Table 4 when on."""
    toy = ([TABLES / "straightdp_figure6_toy.parquet", FIGURES / "straightdp_figure6_toy.png"]
           if sdp_toy_enabled() else [])
    table4 = [TABLES / "straightdp_table4_text.parquet"] if sdp_table4_enabled() else []
    # a table whose rows are not configured is left out (Table 3 needs a LoRA row: guidance alone is Table 1's)
    tables = [t for t in SDP_TABLES
              if (runs := sdp_table_runs(t)) and (t != "table3_frozen" or any(r.lora for r in runs))]
    tables += [f"table2_{panel}" for panel in sdp_table2_panels()]
    return [*(TABLES / f"straightdp_{t}.parquet" for t in tables),
            *(FIGURES / f"straightdp_{f}.png" for f in ("figure2_horizon", "figure3_accuracy", "figure5_samples")),
            *toy, *table4]


def sdp_transcripts():
    """One claim per transcript: each releasing run's Stage 1 line, each training run's Stage 2 line (bound to the
    run, its arm's delta and the private split it reads); the toy's and Table 4's lines bound to their table job."""
    delta = config["straightdp"]["delta"]
    out = {}
    for run in sdp_all_runs():
        common = dict(claims=1, run=run.name, delta=sdp_arm_section(run.arm)["delta"], data=sdp_private_data(run.arm))
        if run.releases:
            out[sdp_release_ledger(run.name)] = TranscriptSpec(stage="release_moments", **common)
        if run.trains:
            out[sdp_train_ledger(run.name)] = TranscriptSpec(stage="train_straightdp", **common)
    if sdp_toy_enabled():
        out[SDP_TOY_LEDGER] = TranscriptSpec(claims=sdp_toy_claims(), run="straightdp_figure6_toy",
                                             stage="straightdp_figure6_toy", delta=delta, data=DATA / "toy.npz")
    if sdp_table4_enabled():
        out[SDP_TABLE4_LEDGER] = TranscriptSpec(claims=sdp_table4_claims(), run="straightdp_table4_text",
                                                stage="straightdp_table4_text", delta=delta,
                                                data=DATA / "private_train.npz")
    return out


def sdp_records():
    """all_runs records: every run ``all`` builds, its release and/or train transcript; the main grid's runs
    are the figure's lines (one per row), an arm's stay in the table (ablations)."""
    from pipeline.registry import RunRecord

    out = []
    for run in sdp_all_runs():
        ledgers = ((sdp_release_ledger(run.name),) if run.releases else ()) + \
                  ((sdp_train_ledger(run.name),) if run.trains else ())
        rules = (("release_moments",) if run.releases else ()) + (("train_straightdp",) if run.trains else ()) + \
                ("sample_straightdp", "evaluate_straightdp")
        arm = f" [{run.arm}]" if run.arm else ""
        out.append(RunRecord(method="straightdp", config=run.name, seed=run.seed, epsilon_target=run.epsilon,
                             metrics=sdp_metrics_path(run.name), ledgers=ledgers,
                             label=f"STRAIGHTDP{arm}: {straightdp_runs.LABELS[run.row]}", in_figure=not run.arm,
                             benchmarks=tuple(benchmark_path(rule, run.name) for rule in rules)))
    return out
