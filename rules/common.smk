# Config validation, paths and the method registry shared by every rule file.
# Method-specific helpers live in the method's own rules/<method>.smk; run grammars and cost
# models in each method's folder (pipeline/methods/<method>/: runs.py, costs.py). A rule's
# whole `resources:` is its request in its method's cost model, `**X.resources("rule")` of the
# method's wiring (pipeline/methods/<method>/costs.py); the house's own rules ask HOUSE
# (pipeline/resources.py HOUSE_REQUESTS), which also holds the shared cost arithmetic (`cost`).
import json
import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, workflow.basedir)

import pipeline.resources as cost
from pipeline.config import ConfigError, deep_merge, typed_overrides, validate_config
from pipeline.inputs import check_inputs_exist
from pipeline.methods._house import Outputs as _HouseOutputs
from pipeline.methods._house import run_table_inputs, run_table_params
from pipeline.registry import MethodRegistry, TranscriptSpec
from pipeline.wiring import RUNTIME_PARAMS, House, io_args, params_json, stage_params

# nested --config values arrive as strings from Snakemake ('dpdm={K: 2}'): type them
config.update(deep_merge(config, typed_overrides(workflow.config_settings.overwrite_config)))
try:
    _validated = validate_config(config)
    # every dataset and weights file, before any job is scheduled: Snakemake deletes a job's outputs
    # before running it, so a source missing inside prepare_data would cost a finished run its splits
    # the plan command (pipeline/plan.py) reads no data: it may plan a preset on a machine without its datasets
    if os.environ.get("DPGEN_PLAN_ONLY") != "1":
        check_inputs_exist(_validated)
except ConfigError as _exc:
    # One line naming the key, instead of a schema dump.
    sys.exit(f"{_exc}")
config.clear()
# validated against the whole schema (the house's and every method's section) with defaults filled
config.update(_validated)

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
#: threads of a job that runs a small torch model (pipeline/resources.py torch_threads)
TORCH_THREADS = HOUSE.torch_threads
benchmark_path = HOUSE.layout.benchmark
ledger_binding = HOUSE.ledger_binding
data_splits = HOUSE.data_splits
method_on = HOUSE.method_on


# ----------------------------------------------------------------------------- method registry
# Each rules/<method>.smk builds its method's wiring and registers it with one call, register(WIRING): its targets,
# and its ledger transcripts, evaluated runs and bundles where it has them (functions, called lazily, so include
# order does not matter); config `methods` chooses which reach rule all, results/index.html and the replay, in that
# list's order (pipeline/registry.py: MethodRegistry.register, the MethodWiring protocol).
REGISTRY = MethodRegistry()
register = REGISTRY.register
#: captions of the report's tables and figures (reStructuredText, one file per table or figure)
#: (this file's directory is rules/: the workflow's own basedir would be a wrapping Snakefile's when one
#: includes this repository's Snakefile)
CAPTIONS = Path(workflow.current_basedir.get_path_or_uri(secret_free=True)).parent / "report" / "captions"
#: rule all's targets, the report's tables, figures, captions and categories, the replay's transcripts, all_runs'
#: rows: the core's and the chosen methods' (pipeline/methods/_house.py)
OUTPUTS = _HouseOutputs(HOUSE, REGISTRY, CAPTIONS)
#: where the report's readable table views go (rule report_tables)
REPORT_DIR = HOUSE.layout.report_dir


def report_figure(name):
    """FIGURES/<name>.png flagged for Snakemake's report, with its caption and category."""
    return report(FIGURES / f"{name}.png", caption=OUTPUTS.caption_path(name, "figure"),
                  category=OUTPUTS.report_category(name), subcategory="figures")
