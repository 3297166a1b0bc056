# Two commands do all set-up on a fresh machine:
#   make run    create .venv if missing, install the pinned dependencies, run the DAG
#   make test   the same set-up, then the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORES ?= 2
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE ?= 1
export PYTHONHASHSEED ?= 0

.PHONY: install run run-full bundles report plan gpu-check test test-slow docs lint slurm-profile slurm-test bench clean help

help:
	@echo "make run            the quick tour: every method and table of the embedded default (snakemake --cores $(CORES) all)"
	@echo "make run CONFIG=f   the same over a preset merged on config.yaml (e.g. CONFIG=configs/mnist.yaml; also for make report)"
	@echo "make plan CONFIG=f  jobs, hours, GPU-hours and memory the slurm profile would request (nothing submitted)"
	@echo "make gpu-check      this GPU's rates and efficiencies (< 8 min) against the plan's; WRITE=name stores them"
	@echo "make bundles        after make run: every private run's certified bundle -> results/bundles/ (also in all)"
	@echo "make run-full       the reference embedded run the docs' numbers come from (+ configs/digits_full.yaml, several hours)"
	@echo "make report         after make run: Snakemake's report of every table and figure -> $(REPORT)"
	@echo "make test           unit tests on $(CORES) cores (CI runs this, then the slow tier)"
	@echo "make test-slow      the slow tier: Snakemake dry runs and the tiny end-to-end DAG (~15 min)"
	@echo "make docs           the documentation site: mkdocs build --strict -> site/ (open site/index.html)"
	@echo "make lint           snakemake --lint and dry runs of the local and slurm profiles"
	@echo "make slurm-profile  link profiles/slurm to ~/.config/snakemake/slurm (then: snakemake --profile slurm all)"
	@echo "make slurm-test     (root, Debian 12) start a single-node SLURM cluster, run tests/slurm, stop it"
	@echo "make bench          benchmarks/ (prints ratios measured side by side)"
	@echo "make clean          remove results/ and .snakemake/ (keeps .venv)"

$(STAMP): envs/requirements.txt envs/requirements-nodeps.txt envs/constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip==26.3"
	$(BIN)/python -m pip install -r envs/requirements.txt -c envs/constraints.txt
	$(BIN)/python -m pip install --quiet --no-deps -r envs/requirements-nodeps.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

install: $(STAMP)

# CONFIG: configuration files merged over config.yaml (make run CONFIG=configs/mnist.yaml). Each is checked here
# first: Snakemake itself answers a missing --configfile with a 26-line traceback from inside its CLI, before any
# workflow code runs (so the Snakefile cannot say it in one line)
CONFIG ?=
$(foreach f,$(CONFIG),$(if $(wildcard $(f)),,$(error CONFIG file $(f) not found (expected a YAML file merged over config.yaml, e.g. configs/mnist.yaml))))
CONFIG_ARGS := $(if $(strip $(CONFIG)),--configfile $(CONFIG))

run: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) all $(CONFIG_ARGS)

# more seeds and samples over the same DAG (same results tree: its jobs rerun where params differ)
run-full: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) all --configfile configs/digits_full.yaml

# every private run's certified bundle (weights or synthetic set + transcripts, certificate, model card; pipeline/bundles)
bundles: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) export_bundles $(CONFIG_ARGS)

# the report of a finished run (runs no job): summary first, every table and figure with its caption
REPORT ?= results/report.html
# what the slurm profile would ask a cluster for (jobs, hours, GPU-hours, memory per rule), nothing submitted
plan: $(STAMP)
	$(BIN)/python -m pipeline plan $(if $(strip $(CONFIG)),--configfile $(CONFIG))

# every workload the cost models count, for a few steps on this machine's GPU (pipeline/gpu_check.py): seconds and
# efficiency (counted FLOPs over the peaks of the named entry matching the GPU, or PEAKS=entry); WRITE=name stores
# them in pipeline/device_rates.yaml (then slurm.device_rates: name)
gpu-check: $(STAMP)
	$(BIN)/python -m pipeline gpu_check $(if $(strip $(WRITE)),--write $(WRITE)) $(if $(strip $(PEAKS)),--peaks $(PEAKS))

report: $(STAMP)
	$(BIN)/snakemake --report $(REPORT) --report-stylesheet report/style.css $(CONFIG_ARGS)

# the unit tier on every core (one xdist worker per core; idle workers steal queued tests); the slow
# tier starts Snakemake (dry runs, the tiny end-to-end DAG) or kills fresh Python processes
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(CORES) --dist worksteal -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow -n $(CORES) --dist worksteal --durations=0

# the documentation site (mkdocs.yml, docs/): strict, so a broken link, a missing page in the nav or a
# docstring mkdocstrings cannot render fails the build; offline (no Google fonts, no plugin on the network)
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(BIN)/snakemake --lint
	$(BIN)/snakemake -n --cores $(CORES) all
	$(BIN)/snakemake -n --profile profiles/slurm all

slurm-profile:
	mkdir -p $(HOME)/.config/snakemake
	ln -sfn $(CURDIR)/profiles/slurm $(HOME)/.config/snakemake/slurm
	@echo "linked $(HOME)/.config/snakemake/slurm -> $(CURDIR)/profiles/slurm"
	@echo "now: snakemake --profile slurm all   (export DPGEN_SLURM_PARTITION/DPGEN_SLURM_ACCOUNT first if needed)"

slurm-test: $(STAMP)
	.ci/slurm/install.sh
	.ci/slurm/start.sh
	DPGEN_SLURM_TEST=1 DPGEN_SLURM_PARTITION=$$(. .ci/slurm/env.sh && echo "$$PARTITION") DPGEN_SLURM_ACCOUNT=root \
		$(BIN)/python -m pytest -q -m slurm tests/slurm; rc=$$?; .ci/slurm/stop.sh; exit $$rc

bench: $(STAMP)
	@set -e; for b in $(wildcard benchmarks/bench_*.py); do echo "== $$b"; $(BIN)/python $$b; done

clean:
	rm -rf results .snakemake
