# Baselines under the same protocol: DP-MERF (one noisy RFF mean embedding, a generator matched to it)
# and Private Evolution (noisy nearest-neighbour votes steering the public EDM denoiser), scored by the
# shared evaluation, certified by the same ledger. Code: pipeline/baselines/ (stages),
# pipeline/privacy/dp_merf.py and pipeline/privacy/private_evolution.py (mechanisms),
# pipeline/results/baselines.py (table). Runs and names: pipeline/baselines/runs.py.
#
#   snakemake results/tables/baselines.parquet                         the table
#   snakemake results/digits/eval/baselines/pe_eps1_seed0/metrics.json one run, evaluated

include: "functions/baselines.smk"

register_targets("baselines", lambda: [BASELINES_TABLE])
register_transcripts("baselines", baseline_transcripts)
register_runs("baselines", baseline_records)


rule dp_merf:
    """DP-MERF: the class-conditional RFF mean embedding released once (Gaussian, sensitivity 2/m), a generator fit to it."""
    input:
        data=DATA / "private_train.npz",
        public=DATA / "public.npz",
    output:
        samples=baseline_samples_path("{run}"),
        manifest=EXPDIR / "samples" / "baselines" / "{run}.json",
        ledger=baseline_ledger_path("{run}"),
        metrics=EXPDIR / "train" / "baselines" / "{run}.json",
    wildcard_constraints:
        run=baseline_runs.method_pattern("dp_merf"),
    params:
        p=baseline_params,
    log:
        LOGS / "baselines" / "{run}.log",
    benchmark:
        benchmark_path("dp_merf", "{run}")
    threads: TORCH_THREADS
    resources:
        gpu=1,
        mem_mb=3000,
        runtime=cost.baseline_runtime_min(config),
    conda:
        GPU_ENV
    shell:
        "python -m pipeline dp_merf --in data={input.data:q} public={input.public:q} --out samples={output.samples:q}"
        " ledger={output.ledger:q} metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule private_evolution:
    """Private Evolution: T noisy nearest-neighbour vote histograms (Gaussian, sensitivity 1) over the public denoiser."""
    input:
        unpack(lambda wildcards: {"clip": CLIP_MODEL} if config["baselines"]["pe"]["embedding"] == "clip" else {}),
        data=DATA / "private_train.npz",
        denoiser=PUBLIC_DENOISER,
    output:
        samples=baseline_samples_path("{run}"),
        manifest=EXPDIR / "samples" / "baselines" / "{run}.json",
        ledger=baseline_ledger_path("{run}"),
        metrics=EXPDIR / "train" / "baselines" / "{run}.json",
    wildcard_constraints:
        run=baseline_runs.method_pattern("pe"),
    params:
        p=baseline_params,
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
    log:
        LOGS / "baselines" / "{run}.log",
    benchmark:
        benchmark_path("private_evolution", "{run}")
    threads: TORCH_THREADS
    resources:
        gpu=1,
        mem_mb=3000,
        runtime=cost.baseline_runtime_min(config),
    conda:
        GPU_ENV
    shell:
        "python -m pipeline private_evolution {params.ins} --out samples={output.samples:q}"
        " ledger={output.ledger:q} metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule evaluate_baseline:
    """Score one baseline run's samples with the evaluation core (the same call as every method's)."""
    input:
        unpack(clip_inputs),
        samples=baseline_samples_path("{run}"),
        test=DATA / "test.npz",
        evalnet=EVALNET / "evalnet.pt",
    output:
        metrics=baseline_metrics_path("{run}"),
    wildcard_constraints:
        run=baseline_runs.RUN_PATTERN,
    params:
        p=lambda wildcards: params_json(evaluation=evaluation_params(), seed=SEED, device=config["device"],
                                        threads=TORCH_THREADS, name=f"baselines/{wildcards.run}"),
        clip=clip_arg,
    log:
        LOGS / "evaluate_baseline" / "{run}.log",
    benchmark:
        benchmark_path("evaluate_baseline", "{run}")
    threads: TORCH_THREADS
    resources:
        gpu=1,
        mem_mb=6000,
        runtime=cost.evaluation_runtime_min(config),
    conda:
        GPU_ENV
    shell:
        "python -m pipeline evaluate_samples --in samples={input.samples:q} test={input.test:q}"
        " evalnet={input.evalnet:q}{params.clip} --out metrics={output.metrics:q} --params {params.p:q}"
        " --log {log:q}"


rule baselines_table:
    """The baselines' runs: shared metrics, certified eps recomputed from each transcript (<= target), cost."""
    input:
        unpack(lambda wildcards: run_table_inputs(baseline_records())),
    output:
        table=BASELINES_TABLE,
    params:
        p=lambda wildcards: run_table_params(baseline_records()),
        ins=lambda wildcards: io_args("--in", run_table_inputs(baseline_records())),
    benchmark:
        benchmark_path("baselines_table")
    log:
        LOGS / "baselines_table.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline baselines_table {params.ins} --out table={output.table:q} --params {params.p:q}"
        " --log {log:q}"
