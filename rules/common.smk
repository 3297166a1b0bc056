# Config validation, paths and the method registry shared by every rule file.
# Method-specific helpers live in the method's own rules/<method>.smk; run grammars and cost
# models in pipeline/ (pipeline/sampling/empden_grid.py, pipeline/training/dpdm_runs.py,
# pipeline/resources.py).
import json
import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, workflow.basedir)

from snakemake.utils import validate

import pipeline.resources as cost
from pipeline.config import ConfigError, deep_merge, schema_path, typed_overrides, validate_config
from pipeline.inputs import check_inputs_exist
from pipeline.methods import report_categories
from pipeline.registry import MethodRegistry, TranscriptSpec
from pipeline.wiring import RUNTIME_PARAMS, House, io_args, params_json, stage_params

# nested --config values arrive as strings from Snakemake ('dpdm={K: 2}'): type them
config.update(deep_merge(config, typed_overrides(workflow.config_settings.overwrite_config)))
try:
    _validated = validate_config(config)
    # every dataset and weights file, before any job is scheduled: Snakemake deletes a job's outputs
    # before running it, so a source missing inside prepare_data would cost a finished run its splits
    check_inputs_exist(_validated)
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

# glibc maps every allocation above its (adaptive) mmap threshold with its own mmap and trims
# freed heap back to the OS, so a job's tensors are faulted in page by page again and again:
# 15-25% of a job's CPU went to the kernel (audit_mia: 4.7-6.6 s sys of 25-27 s wall). Up to
# 32 MiB from the heap, trimmed only above 1 GiB: audit_mia 20-21 s, sample_straightdp 13.2 ->
# 11.6 s, outputs bit-equal (measured 2026-12-04). Inherited by every job's shell (also inside a
# SLURM job, which runs this file again); a user's own GLIBC_TUNABLES wins; non-glibc ignores it.
os.environ.setdefault("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824")

# conda envs for `--use-conda` (paths relative to rules/); GPU rules take the CUDA one
CPU_ENV = "../envs/cpu.yaml"
GPU_ENV = "../envs/cuda.yaml"
#: the validated config and its results tree, what every method's wiring reads (pipeline/wiring.py)
HOUSE = House.from_config(config)
EXP = config["experiment"]
RESULTS = HOUSE.layout.results
EXPDIR = HOUSE.layout.expdir
DATA = HOUSE.layout.data
LOGS = HOUSE.layout.logs
TABLES = HOUSE.layout.tables
FIGURES = HOUSE.layout.figures
SEED = config["seed"]
#: the private set's declared size N and number of classes (public constants): the ``private`` param of every
#: stage whose release normalises or shapes by them (pipeline.config.declared_private)
PRIVATE = HOUSE.private
PUBLIC_DENOISER = HOUSE.layout.public_denoiser
REPLAY_REPORT = HOUSE.layout.replay_report
BENCHMARKS = HOUSE.layout.benchmarks
#: threads of a job that runs a small torch model (pipeline/resources.py)
TORCH_THREADS = HOUSE.torch_threads
benchmark_path = HOUSE.layout.benchmark
ledger_binding = HOUSE.ledger_binding
data_splits = HOUSE.data_splits
method_on = HOUSE.method_on


# ----------------------------------------------------------------------------- method registry
# Each rules/<method>.smk registers its method's targets and ledger transcripts (functions,
# called lazily, so include order does not matter); config `methods` chooses which reach
# rule all, results/index.html and the replay, in that list's order (pipeline/registry.py).

REGISTRY = MethodRegistry()


def register_targets(method, targets):
    """``targets()``: the method's tables (.parquet) and figures (.png; PDF beside) for rule all and the index."""
    REGISTRY.register_targets(method, targets)


def register_transcripts(method, transcripts):
    """``transcripts()``: {ledger transcript path: TranscriptSpec (claims, run, stage, delta, data)}, the replay's
    inputs and what it checks every line against."""
    REGISTRY.register_transcripts(method, transcripts)



def register_runs(method, runs):
    """``runs()``: the method's evaluated runs (pipeline.registry.RunRecord), the rows of all_runs.parquet."""
    REGISTRY.register_runs(method, runs)


def all_run_records():
    """Every evaluated run of the core references and the chosen methods (all_runs.parquet's rows)."""
    return [*CORE_RUNS, *_registered(REGISTRY.runs)]


def run_table_inputs(records):
    """metrics_i and ledger_i_j of each run record: the inputs of all_runs_table (and of a method's run table)."""
    out = {}
    for i, r in enumerate(records):
        out[f"metrics_{i}"] = r.metrics
        out.update({f"ledger_{i}_{j}": p for j, p in enumerate(r.ledgers)})
    return out


def run_table_params(records):
    runs = [{k: v for k, v in r.as_dict().items() if k not in ("metrics", "ledgers")} for r in records]
    return stage_params(runs=runs)



def _registered(query):
    try:
        return query(config["methods"])
    except ValueError as exc:  # a chosen method that no file registers: one line, not a traceback
        raise WorkflowError(str(exc)) from None


#: the tables and figures made after every other job: the comparison (its cost columns come from the
#: runtime table) and the runtime table of every job before them (rules/report.smk)
AFTER_ALL = [FIGURES / "privacy_utility.png", TABLES / "all_runs.parquet", TABLES / "runtime.parquet",
             FIGURES / "runtime.png"]
#: the core tables and figures every config reports (rules/report.smk); the comparison first
CORE_REPORT = [*AFTER_ALL, TABLES / "reference_real.parquet", FIGURES / "data_samples.png"]


def report_inputs():
    """Every table and figure (PNG; the PDF is written beside it) of the core and the chosen methods."""
    return [*CORE_REPORT, *_registered(REGISTRY.report_targets)]


def ledger_claims():
    """Ledger transcript -> its TranscriptSpec, of every chosen method: the replay's inputs."""
    return _registered(REGISTRY.transcripts)


def ledger_transcripts():
    """Every ledger transcript the config produces."""
    return list(ledger_claims())


def all_targets():
    """Every output of the target `all`: data, tables, figures, the ledger replay, the summary page and the
    report's table views (rules/review.smk).

    The public denoiser (rules/pretrain.smk) is built whenever a method that uses it is chosen.
    """
    return [*data_splits().values(), *CORE_REPORT, *_registered(REGISTRY.targets), REPLAY_REPORT,
            RESULTS / "index.html", REPORT_DIR / "tables"]


# ---- snakemake --report (make report): captions under report/captions/, categories per paper/method

#: captions of the report's tables and figures (reStructuredText, one file per table or figure)
#: (this file's directory is rules/: the workflow's own basedir would be a wrapping Snakefile's when one
#: includes this repository's Snakefile)
CAPTIONS = Path(workflow.current_basedir.get_path_or_uri(secret_free=True)).parent / "report" / "captions"
#: the caption of a table or figure nobody has written one for (a test keeps the default config free of it)
MISSING_CAPTION = CAPTIONS / "_missing.rst"
#: the core's report categories (the number orders the menu); each method declares its own
#: (pipeline/methods/<method>: METHOD.report_category), and a table or figure goes to the first whose prefix its name has
CORE_REPORT_CATEGORIES = (("privacy_utility", "1 Comparison"), ("all_runs", "1 Comparison"),
                          ("reference_real", "2 Data and evaluation"), ("data_samples", "2 Data and evaluation"),
                          ("runtime", "9 Cost"))
REPORT_CATEGORIES = (*CORE_REPORT_CATEGORIES, *report_categories())
#: each method's headline row on the summary page: its configuration whose certified eps is nearest this
HEADLINE_EPSILON = 1.0
#: where the report's readable table views go (rule report_tables)
REPORT_DIR = RESULTS / "report"


def report_category(name):
    return next((cat for prefix, cat in REPORT_CATEGORIES if name.startswith(prefix)), "10 Other")


def caption_path(name, kind):
    """report/captions/<name>_<kind>.rst (where a table and a figure share a name), else <name>.rst."""
    for candidate in (CAPTIONS / f"{name}_{kind}.rst", CAPTIONS / f"{name}.rst"):
        if candidate.is_file():
            return str(candidate)
    return str(MISSING_CAPTION)


def report_figure(name):
    """FIGURES/<name>.png flagged for Snakemake's report, with its caption and category."""
    return report(FIGURES / f"{name}.png", caption=caption_path(name, "figure"), category=report_category(name),
                  subcategory="figures")


def report_table_inputs():
    """Table name -> Parquet path of every table of `all`: each gets a readable view in the report (rule report_tables,
    results/report/tables/<name>.html)."""
    return {Path(p).stem: p for p in report_inputs() if Path(p).suffix == ".parquet"}
