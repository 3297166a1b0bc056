# Config validation, paths and target lists shared by every rule file.
import json
import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, workflow.basedir)

from snakemake.utils import validate

from pipeline.config import ConfigError, config_id, schema_path, validate_config

try:
    _validated = validate_config(config)
except ConfigError as _exc:
    # One line naming the key, instead of a schema dump.
    sys.exit(f"{_exc}")
config.clear()
config.update(_validated)
validate(config, schema=str(schema_path()), set_default=True)

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
CONFIG_ID = config_id(config)
SEED = config["seed"]


def params_json(**sections):
    """Stage params as one JSON string (quote in shell with {params.p:q})."""
    return json.dumps(sections, sort_keys=True)


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
    return params_json(config_id=CONFIG_ID, seed=sg["seed"], **{section: sg[section]})


def report_inputs():
    """Every table and figure (PNG; the PDF is written beside it) the config enables."""
    return [
        TABLES / "reference_real.parquet",
        FIGURES / "data_samples.png",
        *[p for p in accounting_targets() if p.suffix in (".parquet", ".png")],
        *sensgeo_targets(),
    ]


def all_targets():
    """Every output of the target `all`: data, tables, figures, the ledger replay, the index page."""
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
    """SLURM runtime (minutes) for scoring one sample set (features + 3 downstream classifiers)."""
    n = config["data"]["private"]["n_test"]
    side = config["data"]["image_size"]
    epochs = config["evaluation"]["downstream"]["cnn_epochs"]
    return max(10, int(4 * epochs * n * (side / 16) ** 2 * 2e-3 / 60) + 10)
