# DPDM's wiring functions (rules/dpdm.smk includes this file): a run's files, the tables' rows and
# inputs, train/sample params, its targets. Runs and rows: pipeline/training/dpdm_runs.py.
from pipeline.training import dpdm_runs
from pipeline.training.dpdm_runs import DpdmRun, fmt_num


def dpdm_sampler_settings(name):
    """The settings of the sampler ``name`` (dpdm.sampling.samplers); a one-line error when absent."""
    try:
        return dpdm_runs.sampler_settings(config["dpdm"], name)
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None


def dpdm_ledger_path(run):
    """The run's own transcript: parallel training jobs never append to the same file."""
    return EXPDIR / "ledger" / f"train_dpdm_{run}.jsonl"


def dpdm_model_path(run):
    return EXPDIR / "models" / "dpdm" / f"{run}.pt"


def dpdm_samples_path(run, sampler):
    return EXPDIR / "samples" / "dpdm" / run / f"{sampler}.npz"


def dpdm_metrics_path(run, sampler):
    return EXPDIR / "eval" / "dpdm" / run / sampler / "metrics.json"


#: the main sampler chosen on the validation split (checkpoint dpdm_select_sampler), when dpdm.sampling.main is auto
DPDM_SELECTION = EXPDIR / "dpdm" / "sampler_selection.json"


def dpdm_main_sampler():
    """dpdm.sampling.main, or under `auto` the sampler the checkpoint dpdm_select_sampler chose on val."""
    main = config["dpdm"]["sampling"]["main"]
    if main != dpdm_runs.AUTO:
        return main
    with open(checkpoints.dpdm_select_sampler.get().output.selection) as f:
        return json.load(f)["sampler"]


def dpdm_rows(table):
    """The rows of one DPDM table (pipeline.training.dpdm_runs.TABLES); the sampler ablation never waits
    for the choice it feeds, the other tables use the chosen main sampler."""
    build, _ = dpdm_runs.TABLES[table]
    d = config["dpdm"]
    if table != "dpdm_table_samplers" and d["sampling"]["main"] == dpdm_runs.AUTO:
        d = dpdm_runs.with_main_sampler(d, dpdm_main_sampler())
    return build(d)


def dpdm_targets():
    """DPDM tables and figures: the main table and the epsilon grid always, the ablations the dpdm section asks for."""
    tables = dpdm_runs.table_rows(config["dpdm"])
    out = [TABLES / "dpdm_table_main.parquet", FIGURES / "dpdm_samples_by_epsilon.png"]
    if "dpdm_table_noise_multiplicity" in tables:
        out.append(TABLES / "dpdm_table_noise_multiplicity.parquet")
    if "dpdm_table_samplers" in tables:
        out += [TABLES / "dpdm_table_samplers.parquet", FIGURES / "dpdm_samples_by_sampler.png"]
    if "dpdm_table_configurations" in tables:
        out.append(TABLES / "dpdm_table_configurations.parquet")
    return out


def dpdm_table_inputs(rows):
    """metrics_<row> / ledger_<row> of every row: the inputs of one dpdm_table rule."""
    out = {}
    for r in rows:
        out[f"metrics_{r['row']}"] = dpdm_metrics_path(r["run"], r["sampler"])
        out[f"ledger_{r['row']}"] = dpdm_ledger_path(r["run"])
    return out


def dpdm_selection_inputs():
    """metrics_<row> of the sampler ablation: what the choice of the main sampler reads (their val columns)."""
    return {f"metrics_{r['row']}": dpdm_metrics_path(r["run"], r["sampler"]) for r in dpdm_rows("dpdm_table_samplers")}


def dpdm_table_params(rows):
    return stage_params(rows=rows, seed=SEED)


def dpdm_train_inputs(wildcards):
    inputs = {"data": DATA / "private_train.npz"}
    if dpdm_runs.init_of(config["dpdm"], DpdmRun.from_name(wildcards.run).parameterisation) == "public":
        inputs["init"] = PUBLIC_DENOISER
    return inputs


def dpdm_train_params(wildcards):
    """train_dpdm params of one run: the dpdm section, with configuration, eps, K and seed from the run name."""
    d = config["dpdm"]
    run = DpdmRun.from_name(wildcards.run)
    keys = ("delta", "clip", "batch_size", "epochs", "lr", "ema_decay", "label_dropout", "class_conditional",
            "unet", "checkpoint_every_s", "micro_batch")
    # partial fine-tuning only makes sense on top of the public weights (a scratch run trains all)
    trainable = d["trainable"] if dpdm_runs.init_of(d, run.parameterisation) == "public" else None
    return stage_params(parameterisation=run.parameterisation, epsilon=run.epsilon, K=run.K, seed=run.seed,
                        device=config["device"], threads=TORCH_THREADS, trainable=trainable,
                        ledger_binding=ledger_binding(run.name), private=PRIVATE, **{k: d[k] for k in keys})


def dpdm_sample_params(wildcards):
    """sample_dpdm params of one (run, sampler): the named sampler, generated with the run's seed."""
    s = config["dpdm"]["sampling"]
    return params_json(sampler=dpdm_sampler_settings(wildcards.sampler), n_samples=s["n_samples"],
                       seed=DpdmRun.from_name(wildcards.run).seed, batch_size=s["batch_size"],
                       per_class=s["per_class"], device=config["device"], threads=TORCH_THREADS,
                       name=f"dpdm/{wildcards.run}/{wildcards.sampler}")


def dpdm_grid_inputs():
    """Figure dpdm_samples_by_epsilon: the main sampler's samples of each epsilon (first seed)."""
    d = config["dpdm"]
    sampler = dpdm_main_sampler()
    return {f"eps_{fmt_num(e)}": dpdm_samples_path(dpdm_runs.main_run(d, e).name, sampler) for e in d["epsilons"]}


def dpdm_grid_titles():
    return {f"eps_{fmt_num(e)}": f"eps = {e:g}" for e in config["dpdm"]["epsilons"]}


def dpdm_sampler_grid_eps():
    """The epsilon figure dpdm_samples_by_sampler shows: the largest of the sampler ablation."""
    return max(config["dpdm"]["sampler_ablation"]["epsilons"])


def dpdm_sampler_grid_inputs():
    """Figure dpdm_samples_by_sampler: the sampler ablation's samples at :func:`dpdm_sampler_grid_eps`."""
    return {r["sampler"]: dpdm_samples_path(r["run"], r["sampler"]) for r in dpdm_rows("dpdm_table_samplers")
            if r["eps_target"] == float(dpdm_sampler_grid_eps())}


def dpdm_records():
    """all_runs records: every evaluated (run, sampler) of the DPDM tables; the main table's rows are the
    figure's DPDM line (the main sampler, chosen on val), the ablations' rows stay in the table."""
    from pipeline.registry import RunRecord

    out = []
    for table in dpdm_runs.table_rows(config["dpdm"]):
        main = table == "dpdm_table_main"
        for r in dpdm_rows(table):
            out.append(RunRecord(method="dpdm", config=f"{r['run']}/{r['sampler']}", seed=r["seed"],
                                 epsilon_target=r["eps_target"], metrics=dpdm_metrics_path(r["run"], r["sampler"]),
                                 ledgers=(dpdm_ledger_path(r["run"]),), label="DPDM" if main else "DPDM (ablations)",
                                 in_figure=main,
                                 benchmarks=(benchmark_path("train_dpdm", r["run"]),
                                             *(benchmark_path(rule, f"{r['run']}/{r['sampler']}")
                                               for rule in ("sample_dpdm", "evaluate_dpdm")))))
    return out
