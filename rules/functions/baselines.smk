# The baselines' wiring functions (rules/baselines.smk includes this file): a run's files and params,
# the table's inputs, the runs all_runs.parquet reads. Runs and names: pipeline/baselines/runs.py.
from pipeline.baselines import runs as baseline_runs
from pipeline.baselines.runs import BaselineRun
from pipeline.registry import RunRecord

BASELINES_TABLE = TABLES / "baselines.parquet"


def baseline_samples_path(run):
    return EXPDIR / "samples" / "baselines" / f"{run}.npz"


def baseline_ledger_path(run):
    """The run's own transcript: parallel jobs never append to the same file."""
    return EXPDIR / "ledger" / f"baselines_{run}.jsonl"


def baseline_metrics_path(run):
    return EXPDIR / "eval" / "baselines" / run / "metrics.json"


def baseline_run_list():
    return baseline_runs.runs(config["baselines"])


#: keys that list which runs exist, not how one is made (adding an eps reruns nothing built)
BASELINE_LISTING = ("methods", "epsilons", "seeds")


def baseline_params(wildcards):
    section = {k: v for k, v in config["baselines"].items() if k not in BASELINE_LISTING}
    return stage_params(baselines=section, run=wildcards.run, private=PRIVATE, device=config["device"],
                        threads=TORCH_THREADS, ledger_binding=ledger_binding(wildcards.run))


def baseline_transcripts():
    """Each run's one line, bound to the run, its stage, the baselines' delta and the private split."""
    stages = {"dp_merf": "dp_merf", "pe": "private_evolution"}
    return {baseline_ledger_path(r.name): TranscriptSpec(claims=1, run=r.name, stage=stages[r.method],
                                                         delta=config["baselines"]["delta"],
                                                         data=DATA / "private_train.npz")
            for r in baseline_run_list()}


def baseline_records():
    """One all_runs record per baseline run: its metrics, its one transcript, its jobs' benchmarks."""
    out = []
    for run in baseline_run_list():
        train_rule = "dp_merf" if run.method == "dp_merf" else "private_evolution"
        out.append(RunRecord(method=run.method, config=run.name, seed=run.seed, epsilon_target=run.epsilon,
                             metrics=baseline_metrics_path(run.name), ledgers=(baseline_ledger_path(run.name),),
                             benchmarks=(benchmark_path(train_rule, run.name),
                                         benchmark_path("evaluate_baseline", run.name)),
                             label=baseline_runs.LABELS[run.method]))
    return out
