# DPDM (Dockhorn et al. 2023): DP-SGD training with noise multiplicity, DPDM samplers, the
# evaluation core, then the main table, the K / sampler / configuration ablations and sample grids.
# Code: pipeline/training/dp_denoiser.py (train_dpdm), pipeline/sampling/denoiser_stage.py (sample_dpdm,
# dpdm_sample_grid), pipeline/methods/dpdm/table.py (dpdm_table). Runs, their names and the tables'
# rows: pipeline/methods/dpdm/runs.py; a run's files and params, targets, transcripts and all_runs
# records: pipeline/methods/dpdm/wiring.py (DPDM, unit-tested in tests/methods/dpdm/test_wiring.py); each
# rule's resources: its request in pipeline/methods/dpdm/costs.py (REQUESTS).
#
#   snakemake results/digits/models/dpdm/edm_eps1_K2_seed0.pt                 one training run
#   snakemake results/digits/samples/dpdm/edm_eps1_K2_seed0/churn.npz         one sample set
#   snakemake results/digits/eval/dpdm/vpred_eps0p2_K2_seed0/ddim/metrics.json
# Any run name works as a target (e.g. K16 or seed3), not only those the tables use.
#
# Also here: DPDM's task-specific baseline, a classifier trained on the private split by DP-SGD
# (pipeline/methods/dpdm/dpsgd_classifier.py, table dpdm_table_dpsgd_classifier beside DPDM's synthetic-data
# classifiers), and Fig. 3, gradient variance vs noise multiplicity K on public data
# (pipeline/methods/dpdm/gradient_variance.py).
#   snakemake results/digits/eval/dpsgd_classifier/cnn_eps1_seed0/metrics.json  one DP-SGD classifier run
#   snakemake results/figures/dpdm_figure3_gradient_variance.png

from pipeline.methods.dpdm.wiring import Wiring as _DpdmWiring
from pipeline.methods.dpdm.runs import CLASSIFIER_RUN_PATTERN as DPSGD_CLASSIFIER_RUN_PATTERN
from pipeline.methods.dpdm.runs import RUN_PATTERN as DPDM_RUN_PATTERN

#: DPDM's runs, paths and params; under dpdm.sampling.main auto, the main sampler is read from the checkpoint
DPDM = _DpdmWiring(HOUSE, EVALUATION, selection=lambda: checkpoints.dpdm_select_sampler.get().output.selection)

# a sampler name the tables use but the config lacks is a one-line error now, not mid-DAG
try:
    DPDM.check_sampler_names()
except ConfigError as _exc:
    raise WorkflowError(str(_exc)) from None

register(DPDM)


rule train_dpdm:
    """One DP-SGD run (sigma calibrated to the run's eps before training): the EMA denoiser + its ledger line."""
    input:
        unpack(DPDM.train_inputs),
    output:
        model=DPDM.model_path("{run}"),
        ledger=DPDM.ledger_path("{run}"),
        metrics=DPDM.train_metrics("{run}"),
    wildcard_constraints:
        run=DPDM_RUN_PATTERN,
    params:
        p=DPDM.train_params,
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
    log:
        LOGS / "train_dpdm" / "{run}.log",
    benchmark:
        benchmark_path("train_dpdm", "{run}")
    threads: DPDM.train_threads
    resources: **DPDM.resources("train_dpdm")
    retries: cost.segment_retries(config, DPDM.train_runtime_min)
    conda:
        GPU_ENV
    shell:
        "python -m pipeline --nproc {resources.gpu} train_dpdm {params.ins} --out model={output.model:q} ledger={output.ledger:q}"
        " metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule sample_dpdm:
    """Labelled samples of one run with one named sampler (post-processing: no ledger line)."""
    input:
        denoiser=DPDM.model_path("{run}"),
    output:
        samples=DPDM.samples_path("{run}", "{sampler}"),
        manifest=DPDM.samples_manifest("{run}", "{sampler}"),
    wildcard_constraints:
        run=DPDM_RUN_PATTERN,
        sampler="[A-Za-z0-9_]+",
    params:
        p=DPDM.sample_params,
    log:
        LOGS / "sample_dpdm" / "{run}_{sampler}.log",
    benchmark:
        benchmark_path("sample_dpdm", "{run}/{sampler}")
    threads: TORCH_THREADS
    resources: **DPDM.resources("sample_dpdm")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline sample_dpdm --in denoiser={input.denoiser:q} --out samples={output.samples:q}"
        " --params {params.p:q} --log {log:q}"


rule evaluate_dpdm:
    """Score one sample set with the evaluation core (FID/KID/P&R, per-class FID, downstream accuracy on test,
    and on val for the choice of the main sampler)."""
    input:
        unpack(clip_inputs),
        samples=DPDM.samples_path("{run}", "{sampler}"),
        test=DATA / "test.npz",
        val=DATA / "val.npz",
        evalnet=EVALNET / "evalnet.pt",
    output:
        metrics=DPDM.metrics_path("{run}", "{sampler}"),
    wildcard_constraints:
        run=DPDM_RUN_PATTERN,
        sampler="[A-Za-z0-9_]+",
    params:
        p=DPDM.evaluate_params,
        clip=clip_arg,
    log:
        LOGS / "evaluate_dpdm" / "{run}_{sampler}.log",
    benchmark:
        benchmark_path("evaluate_dpdm", "{run}/{sampler}")
    threads: TORCH_THREADS
    resources: **DPDM.resources("evaluate_dpdm")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline evaluate_samples --in samples={input.samples:q} test={input.test:q} val={input.val:q}"
        " evalnet={input.evalnet:q}{params.clip} --out metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


checkpoint dpdm_select_sampler:
    """DPDM's main sampler (dpdm.sampling.main: auto): the sampler ablation's best mean CNN accuracy on val."""
    input:
        unpack(lambda wildcards: DPDM.selection_inputs()),
    output:
        selection=DPDM.selection,
    params:
        p=lambda wildcards: DPDM.selection_params(),
        ins=lambda wildcards: io_args("--in", DPDM.selection_inputs()),
    benchmark:
        benchmark_path("dpdm_select_sampler")
    log:
        LOGS / "dpdm_select_sampler.log",
    threads: 1
    resources: **DPDM.resources("dpdm_select_sampler")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_select_sampler {params.ins} --out selection={output.selection:q}"
        " --params {params.p:q} --log {log:q}"


rule dpdm_table_main:
    """DPDM Table 1: FID and downstream accuracy (logreg/MLP/CNN) per target eps, certified eps from the ledger."""
    input:
        unpack(lambda wildcards: DPDM.table_inputs("dpdm_table_main")),
    output:
        table=DPDM.table_path("dpdm_table_main"),
    params:
        p=lambda wildcards: DPDM.table_params("dpdm_table_main"),
        ins=lambda wildcards: io_args("--in", DPDM.table_inputs("dpdm_table_main")),
    benchmark:
        benchmark_path("dpdm_table_main")
    log:
        LOGS / "dpdm_table_main.log",
    threads: 1
    resources: **DPDM.resources("dpdm_table_main")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_table {params.ins} --out table={output.table:q} --params {params.p:q} --log {log:q}"


rule dpdm_table_noise_multiplicity:
    """DPDM Table 4 / Figure 4: noise multiplicity K at one eps (same mechanism, same eps, for every K)."""
    input:
        unpack(lambda wildcards: DPDM.table_inputs("dpdm_table_noise_multiplicity")),
    output:
        table=DPDM.table_path("dpdm_table_noise_multiplicity"),
    params:
        p=lambda wildcards: DPDM.table_params("dpdm_table_noise_multiplicity"),
        ins=lambda wildcards: io_args("--in", DPDM.table_inputs("dpdm_table_noise_multiplicity")),
    benchmark:
        benchmark_path("dpdm_table_noise_multiplicity")
    log:
        LOGS / "dpdm_table_noise_multiplicity.log",
    threads: 1
    resources: **DPDM.resources("dpdm_table_noise_multiplicity")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_table {params.ins} --out table={output.table:q} --params {params.p:q} --log {log:q}"


rule dpdm_table_samplers:
    """DPDM Table 5 / App. F.4.3: every listed sampler (DDIM, stochastic DDIM, churn, guided) on each eps's main run."""
    input:
        unpack(lambda wildcards: DPDM.table_inputs("dpdm_table_samplers")),
    output:
        table=DPDM.table_path("dpdm_table_samplers"),
    params:
        p=lambda wildcards: DPDM.table_params("dpdm_table_samplers"),
        ins=lambda wildcards: io_args("--in", DPDM.table_inputs("dpdm_table_samplers")),
    benchmark:
        benchmark_path("dpdm_table_samplers")
    log:
        LOGS / "dpdm_table_samplers.log",
    threads: 1
    resources: **DPDM.resources("dpdm_table_samplers")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_table {params.ins} --out table={output.table:q} --params {params.p:q} --log {log:q}"


rule dpdm_table_configurations:
    """DPDM App. C / Table 3: diffusion configurations (EDM, v-prediction, VP, VE) at one small eps."""
    input:
        unpack(lambda wildcards: DPDM.table_inputs("dpdm_table_configurations")),
    output:
        table=DPDM.table_path("dpdm_table_configurations"),
    params:
        p=lambda wildcards: DPDM.table_params("dpdm_table_configurations"),
        ins=lambda wildcards: io_args("--in", DPDM.table_inputs("dpdm_table_configurations")),
    benchmark:
        benchmark_path("dpdm_table_configurations")
    log:
        LOGS / "dpdm_table_configurations.log",
    threads: 1
    resources: **DPDM.resources("dpdm_table_configurations")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_table {params.ins} --out table={output.table:q} --params {params.p:q} --log {log:q}"


rule dpdm_samples_by_epsilon:
    """Figure: main-sampler samples of every target eps (one panel per eps, one row per class)."""
    input:
        unpack(lambda wildcards: DPDM.grid_inputs()),
    output:
        png=report_figure("dpdm_samples_by_epsilon"),
        pdf=FIGURES / "dpdm_samples_by_epsilon.pdf",
    params:
        ins=lambda wildcards: io_args("--in", DPDM.grid_inputs()),
        p=DPDM.grid_params(),
    benchmark:
        benchmark_path("dpdm_samples_by_epsilon")
    log:
        LOGS / "dpdm_samples_by_epsilon.log",
    threads: 1
    resources: **DPDM.resources("dpdm_samples_by_epsilon")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_sample_grid {params.ins} --out figure={output.png:q} --params {params.p:q} --log {log:q}"


rule dpdm_samples_by_sampler:
    """Figure: the sampler ablation's samples at its largest eps (one panel per sampler)."""
    input:
        unpack(lambda wildcards: DPDM.sampler_grid_inputs()),
    output:
        png=report_figure("dpdm_samples_by_sampler"),
        pdf=FIGURES / "dpdm_samples_by_sampler.pdf",
    params:
        ins=lambda wildcards: io_args("--in", DPDM.sampler_grid_inputs()),
        p=DPDM.sampler_grid_params(),
    benchmark:
        benchmark_path("dpdm_samples_by_sampler")
    log:
        LOGS / "dpdm_samples_by_sampler.log",
    threads: 1
    resources: **DPDM.resources("dpdm_samples_by_sampler")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_sample_grid {params.ins} --out figure={output.png:q} --params {params.p:q} --log {log:q}"


rule train_dpsgd_classifier:
    """DPDM's task-specific baseline: a downstream classifier trained on the private split by DP-SGD (sigma
    calibrated to the run's eps), its ledger line, its test and val accuracy."""
    input:
        **DPDM.classifier_inputs,
    output:
        model=DPDM.classifier_model_path("{run}"),
        ledger=DPDM.classifier_ledger_path("{run}"),
        metrics=DPDM.classifier_metrics_path("{run}"),
    wildcard_constraints:
        run=DPSGD_CLASSIFIER_RUN_PATTERN,
    params:
        p=DPDM.classifier_params,
    log:
        LOGS / "train_dpsgd_classifier" / "{run}.log",
    benchmark:
        benchmark_path("train_dpsgd_classifier", "{run}")
    threads: TORCH_THREADS
    resources: **DPDM.resources("train_dpsgd_classifier")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline train_dpsgd_classifier --in data={input.data:q} test={input.test:q} val={input.val:q}"
        " --out model={output.model:q} ledger={output.ledger:q} metrics={output.metrics:q} --params {params.p:q}"
        " --log {log:q}"


rule dpdm_table_dpsgd_classifier:
    """DPDM Sec. 5: DPDM's synthetic-data classifier accuracy beside the task-specific DP-SGD classifier's, per eps,
    certified eps of both from their ledgers."""
    input:
        unpack(lambda wildcards: DPDM.classifier_table_inputs()),
    output:
        table=DPDM.table_path("dpdm_table_dpsgd_classifier"),
    params:
        p=lambda wildcards: DPDM.classifier_table_params(),
        ins=lambda wildcards: io_args("--in", DPDM.classifier_table_inputs()),
    benchmark:
        benchmark_path("dpdm_table_dpsgd_classifier")
    log:
        LOGS / "dpdm_table_dpsgd_classifier.log",
    threads: 1
    resources: **DPDM.resources("dpdm_table_dpsgd_classifier")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_classifier_table {params.ins} --out table={output.table:q} --params {params.p:q}"
        " --log {log:q}"


rule dpdm_figure3_gradient_variance:
    """DPDM Fig. 3 / Theorem 1: gradient variance vs noise multiplicity K with the 1/K line, on PUBLIC data with the
    public denoiser (no privacy cost, no ledger line)."""
    input:
        **DPDM.variance_inputs,
    output:
        table=DPDM.table_path("dpdm_figure3_gradient_variance"),
        png=report_figure("dpdm_figure3_gradient_variance"),
        pdf=FIGURES / "dpdm_figure3_gradient_variance.pdf",
    params:
        p=DPDM.variance_params(),
    log:
        LOGS / "dpdm_figure3_gradient_variance.log",
    benchmark:
        benchmark_path("dpdm_figure3_gradient_variance")
    threads: TORCH_THREADS
    resources: **DPDM.resources("dpdm_figure3_gradient_variance")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline dpdm_gradient_variance --in denoiser={input.denoiser:q} public={input.public:q}"
        " --out table={output.table:q} figure={output.png:q} --params {params.p:q} --log {log:q}"
