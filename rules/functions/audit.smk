# The audit's wiring functions (rules/audit.smk includes this file): which transcripts it reads.
import re

from pipeline.methods import audited_methods


AUDIT_TABLE = TABLES / "audit_one_run.parquet"

#: the methods whose ledger lines the one-run audit reruns: those declaring METHOD.audited (pipeline/methods)
AUDITED_METHODS = tuple(audited_methods())


def _audited_claims():
    """Transcript -> claims of the chosen audited methods (the stage picks the lines it can audit)."""
    return _registered(lambda methods: REGISTRY.transcripts([m for m in AUDITED_METHODS if m in methods]))


def _empden_claims():
    """Transcript -> claims of EMPDEN's sampler runs, when chosen (their audit costs most per line)."""
    return _registered(lambda methods: REGISTRY.transcripts(["empden"] if "empden" in methods else []))


def _audited_transcripts():
    return {Path(p).stem: p for p in _audited_claims()}


# ---- membership inference (table audit_mia, EMPDEN Table 13's numerical column)

MIA_TABLE = TABLES / "audit_mia.parquet"
TABLE13 = TABLES / "empden_table13.parquet"
#: the held-out real split whose records play the non-members (never trained on, nothing chosen from it)
MIA_NONMEMBERS = "reference"


def twin_model_path(seed):
    return EXPDIR / "models" / "dpdm" / f"twin_seed{seed}.pt"


def mia_metrics_path(method, run):
    return EXPDIR / "audit" / "mia" / method / f"{run}.json"


def mia_models():
    """(method, run) of every model the membership attacks score, for the chosen methods."""
    methods = config["methods"]
    models = []
    if "dpdm" in methods:
        d = config["dpdm"]
        models += [("dpdm", dpdm_runs.main_run(d, eps, seed).name) for eps in d["epsilons"] for seed in d["seeds"]]
        models += [("dpdm_twin", f"twin_seed{seed}") for seed in d["seeds"]]
    if "straightdp" in methods:
        models += [("straightdp", r.name) for r in straightdp_runs.runs(config["straightdp"])
                   if r.row in straightdp_runs.PLANS]
    return models


def mia_model_input(wildcards):
    if wildcards.method == "dpdm":
        return dpdm_model_path(wildcards.run)
    if wildcards.method == "straightdp":
        return sdp_model_path(wildcards.run)
    m = re.fullmatch(r"twin_seed([0-9]+)", wildcards.run)
    if m is None:
        raise WorkflowError(f"audit_mia: a dpdm_twin run is named twin_seed<seed>, got {wildcards.run!r}")
    return twin_model_path(int(m[1]))


def mia_table_inputs():
    return {f"{method}__{run}": mia_metrics_path(method, run) for method, run in mia_models()}


def mia_targets():
    methods = config["methods"]
    if not any(m in methods for m in ("dpdm", "straightdp")):
        return []
    targets = [MIA_TABLE]
    if "dpdm" in methods and "accounting" in methods:
        targets.append(TABLE13)
    return targets


def twin_params(wildcards):
    """train_dpdm_twin params: DPDM's main recipe (dpdm section) without the mechanism, at audit.mia's twin_* keys
    (twin_members: how many of the attacked members it trains on, when it trains on members)."""
    d, m = config["dpdm"], config["audit"]["mia"]
    keys = ("batch_size", "lr", "ema_decay", "label_dropout", "class_conditional", "unet", "checkpoint_every_s",
            "parameterisation")
    trainable = d["trainable"] if dpdm_runs.init_of(d, d["parameterisation"]) == "public" else None
    members = {"members": m["twin_members"]} if m["twin_train_on"] == "members" else {}
    return stage_params(epochs=m["twin_epochs"], K=m["twin_K"], seed=int(wildcards.seed), member_seed=SEED,
                        device=config["device"], threads=TORCH_THREADS, trainable=trainable, **members,
                        **{k: d[k] for k in keys})


def twin_inputs(wildcards):
    d = config["dpdm"]
    inputs = {"data": DATA / "private_train.npz"}
    if dpdm_runs.init_of(d, d["parameterisation"]) == "public":
        inputs["init"] = PUBLIC_DENOISER
    if config["audit"]["mia"]["twin_train_on"] == "members":
        inputs["nonmembers"] = DATA / f"{MIA_NONMEMBERS}.npz"
    return inputs


def mia_attack_settings():
    """audit.mia less the twin's keys: editing how the twin trains reruns the twin's attacks only."""
    return {k: v for k, v in config["audit"]["mia"].items() if not k.startswith("twin_")}


def mia_refute_delta():
    """The delta at which a non-private model's eps_refutable is read: DPDM's (the twin's DP runs' claims)."""
    return config["dpdm"]["delta"]


def mia_grid():
    a = config["accounting"]
    return {k: a[k] for k in ("sigma_min", "sigma_max", "rho", "asr_N")}
