# DPDM (Dockhorn et al. 2023): DP-SGD training with noise multiplicity, DPDM samplers, the
# evaluation core, then the main table, the K / sampler / configuration ablations and sample grids.
# Code: pipeline/training/dpdm.py (train_dpdm), pipeline/sampling/dpdm_stage.py (sample_dpdm,
# dpdm_sample_grid), pipeline/results/dpdm.py (dpdm_table). Runs, their names and the tables'
# rows: pipeline/training/dpdm_runs.py; a run's files and params: rules/functions/dpdm.smk.
#
#   snakemake results/digits/models/dpdm/edm_eps1_K2_seed0.pt                 one training run
#   snakemake results/digits/samples/dpdm/edm_eps1_K2_seed0/churn.npz         one sample set
#   snakemake results/digits/eval/dpdm/vpred_eps0p2_K2_seed0/ddim/metrics.json
# Any run name works as a target (e.g. K16 or seed3), not only those the tables use.

include: "functions/dpdm.smk"

# a sampler name the tables use but the config lacks is a one-line error now, not mid-DAG
try:
    dpdm_runs.check_sampler_names(config["dpdm"])
except ConfigError as _exc:
    raise WorkflowError(str(_exc)) from None

register_targets("dpdm", dpdm_targets)
# every run writes its own transcript, with one claim
register_transcripts("dpdm", lambda: {dpdm_ledger_path(r.name): TranscriptSpec(
    claims=1, run=r.name, stage="train_dpdm", delta=config["dpdm"]["delta"], data=DATA / "private_train.npz")
    for r in dpdm_runs.runs(config["dpdm"])})
register_runs("dpdm", dpdm_records)


rule train_dpdm:
    """One DP-SGD run (sigma calibrated to the run's eps before training): the EMA denoiser + its ledger line."""
    input:
        unpack(dpdm_train_inputs),
    output:
        model=dpdm_model_path("{run}"),
        ledger=dpdm_ledger_path("{run}"),
        metrics=EXPDIR / "train" / "dpdm" / "{run}.json",
    wildcard_constraints:
        run=dpdm_runs.RUN_PATTERN,
    params:
        p=dpdm_train_params,
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
    log:
        LOGS / "train_dpdm" / "{run}.log",
    benchmark:
        benchmark_path("train_dpdm", "{run}")
    threads: TORCH_THREADS
    resources:
        gpu=1,
        mem_mb=cost.dpdm_train_mem_mb(config),
        runtime=cost.dpdm_train_runtime_min(config),
    conda:
        GPU_ENV
    shell:
        "python -m pipeline train_dpdm {params.ins} --out model={output.model:q} ledger={output.ledger:q}"
        " metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule sample_dpdm:
    """Labelled samples of one run with one named sampler (post-processing: no ledger line)."""
    input:
        denoiser=dpdm_model_path("{run}"),
    output:
        samples=dpdm_samples_path("{run}", "{sampler}"),
        manifest=EXPDIR / "samples" / "dpdm" / "{run}" / "{sampler}.json",
    wildcard_constraints:
        run=dpdm_runs.RUN_PATTERN,
        sampler="[A-Za-z0-9_]+",
    params:
        p=dpdm_sample_params,
    log:
        LOGS / "sample_dpdm" / "{run}_{sampler}.log",
    benchmark:
        benchmark_path("sample_dpdm", "{run}/{sampler}")
    threads: TORCH_THREADS
    resources:
        gpu=1,
        mem_mb=4000,
        runtime=cost.dpdm_sample_runtime_min(config),
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
        samples=dpdm_samples_path("{run}", "{sampler}"),
        test=DATA / "test.npz",
        val=DATA / "val.npz",
        evalnet=EVALNET / "evalnet.pt",
    output:
        metrics=dpdm_metrics_path("{run}", "{sampler}"),
    wildcard_constraints:
        run=dpdm_runs.RUN_PATTERN,
        sampler="[A-Za-z0-9_]+",
    params:
        p=lambda wildcards: params_json(evaluation=evaluation_params(), seed=SEED, device=config["device"],
                                        threads=TORCH_THREADS, name=f"dpdm/{wildcards.run}/{wildcards.sampler}"),
        clip=clip_arg,
    log:
        LOGS / "evaluate_dpdm" / "{run}_{sampler}.log",
    benchmark:
        benchmark_path("evaluate_dpdm", "{run}/{sampler}")
    threads: TORCH_THREADS
    resources:
        gpu=1,
        mem_mb=6000,
        runtime=cost.evaluation_runtime_min(config),
    conda:
        GPU_ENV
    shell:
        "python -m pipeline evaluate_samples --in samples={input.samples:q} test={input.test:q} val={input.val:q}"
        " evalnet={input.evalnet:q}{params.clip} --out metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


checkpoint dpdm_select_sampler:
    """DPDM's main sampler (dpdm.sampling.main: auto): the sampler ablation's best mean CNN accuracy on val."""
    input:
        unpack(lambda wildcards: dpdm_selection_inputs()),
    output:
        selection=DPDM_SELECTION,
    params:
        p=lambda wildcards: stage_params(rows=dpdm_rows("dpdm_table_samplers")),
        ins=lambda wildcards: io_args("--in", dpdm_selection_inputs()),
    benchmark:
        benchmark_path("dpdm_select_sampler")
    log:
        LOGS / "dpdm_select_sampler.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_select_sampler {params.ins} --out selection={output.selection:q}"
        " --params {params.p:q} --log {log:q}"


rule dpdm_table_main:
    """DPDM Table 1: FID and downstream accuracy (logreg/MLP/CNN) per target eps, certified eps from the ledger."""
    input:
        unpack(lambda wildcards: dpdm_table_inputs(dpdm_rows("dpdm_table_main"))),
    output:
        table=TABLES / "dpdm_table_main.parquet",
    params:
        p=lambda wildcards: dpdm_table_params(dpdm_rows("dpdm_table_main")),
        ins=lambda wildcards: io_args("--in", dpdm_table_inputs(dpdm_rows("dpdm_table_main"))),
    benchmark:
        benchmark_path("dpdm_table_main")
    log:
        LOGS / "dpdm_table_main.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_table {params.ins} --out table={output.table:q} --params {params.p:q} --log {log:q}"


rule dpdm_table_noise_multiplicity:
    """DPDM Table 4 / Figure 4: noise multiplicity K at one eps (same mechanism, same eps, for every K)."""
    input:
        unpack(lambda wildcards: dpdm_table_inputs(dpdm_rows("dpdm_table_noise_multiplicity"))),
    output:
        table=TABLES / "dpdm_table_noise_multiplicity.parquet",
    params:
        p=lambda wildcards: dpdm_table_params(dpdm_rows("dpdm_table_noise_multiplicity")),
        ins=lambda wildcards: io_args("--in", dpdm_table_inputs(dpdm_rows("dpdm_table_noise_multiplicity"))),
    benchmark:
        benchmark_path("dpdm_table_noise_multiplicity")
    log:
        LOGS / "dpdm_table_noise_multiplicity.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_table {params.ins} --out table={output.table:q} --params {params.p:q} --log {log:q}"


rule dpdm_table_samplers:
    """DPDM Table 5 / App. F.4.3: every listed sampler (DDIM, stochastic DDIM, churn, guided) on each eps's main run."""
    input:
        unpack(lambda wildcards: dpdm_table_inputs(dpdm_rows("dpdm_table_samplers"))),
    output:
        table=TABLES / "dpdm_table_samplers.parquet",
    params:
        p=lambda wildcards: dpdm_table_params(dpdm_rows("dpdm_table_samplers")),
        ins=lambda wildcards: io_args("--in", dpdm_table_inputs(dpdm_rows("dpdm_table_samplers"))),
    benchmark:
        benchmark_path("dpdm_table_samplers")
    log:
        LOGS / "dpdm_table_samplers.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_table {params.ins} --out table={output.table:q} --params {params.p:q} --log {log:q}"


rule dpdm_table_configurations:
    """DPDM App. C / Table 3: diffusion configurations (EDM, v-prediction, VP, VE) at one small eps."""
    input:
        unpack(lambda wildcards: dpdm_table_inputs(dpdm_rows("dpdm_table_configurations"))),
    output:
        table=TABLES / "dpdm_table_configurations.parquet",
    params:
        p=lambda wildcards: dpdm_table_params(dpdm_rows("dpdm_table_configurations")),
        ins=lambda wildcards: io_args("--in", dpdm_table_inputs(dpdm_rows("dpdm_table_configurations"))),
    benchmark:
        benchmark_path("dpdm_table_configurations")
    log:
        LOGS / "dpdm_table_configurations.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_table {params.ins} --out table={output.table:q} --params {params.p:q} --log {log:q}"


rule dpdm_samples_by_epsilon:
    """Figure: main-sampler samples of every target eps (one panel per eps, one row per class)."""
    input:
        unpack(lambda wildcards: dpdm_grid_inputs()),
    output:
        png=report_figure("dpdm_samples_by_epsilon"),
        pdf=FIGURES / "dpdm_samples_by_epsilon.pdf",
    params:
        ins=lambda wildcards: io_args("--in", dpdm_grid_inputs()),
        p=lambda wildcards: params_json(per_class=config["dpdm"]["sampling"]["per_class"], titles=dpdm_grid_titles(),
                                        title=f"DPDM samples ({config['dpdm']['sampling']['main']}) by target eps"),
    benchmark:
        benchmark_path("dpdm_samples_by_epsilon")
    log:
        LOGS / "dpdm_samples_by_epsilon.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_sample_grid {params.ins} --out figure={output.png:q} --params {params.p:q} --log {log:q}"


rule dpdm_samples_by_sampler:
    """Figure: the sampler ablation's samples at its largest eps (one panel per sampler)."""
    input:
        unpack(lambda wildcards: dpdm_sampler_grid_inputs()),
    output:
        png=report_figure("dpdm_samples_by_sampler"),
        pdf=FIGURES / "dpdm_samples_by_sampler.pdf",
    params:
        ins=lambda wildcards: io_args("--in", dpdm_sampler_grid_inputs()),
        p=lambda wildcards: params_json(per_class=config["dpdm"]["sampling"]["per_class"],
                                        title=f"DPDM samplers at eps = {dpdm_sampler_grid_eps():g}"),
    benchmark:
        benchmark_path("dpdm_samples_by_sampler")
    log:
        LOGS / "dpdm_samples_by_sampler.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_sample_grid {params.ins} --out figure={output.png:q} --params {params.p:q} --log {log:q}"
