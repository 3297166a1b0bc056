# EMPDEN sampling grid (Sec. 6, App. J): one target path per cell, then the evaluation core,
# then Tables 2, 3, 8/9, 10 and Figures 2, 3, 4 right.
# Code: pipeline/sampling/empden_stage.py (sampling), pipeline/results/empden_results.py
# (tables, figures); cells and their names: pipeline/sampling/empden_grid.py.
#
#   snakemake results/digits/samples/empden/hybrid/p50_B100_T3_beta1_s0.npz     one cell
#   snakemake results/digits/eval/empden/hybrid/p50_B100_T3_beta1_s0/metrics.json
# Numbers in paths have no dots: beta 0.5 is beta0p5, sigma_min 0.002 is smin0p002.

EMPDEN_SAMPLES = EXPDIR / "samples" / "empden"
EMPDEN_TABLE8 = TABLES / "empden_table8_grid.parquet"
EMPDEN_FIGURE2_LEDGER = EXPDIR / "ledger" / "empden_figure2_trajectories.jsonl"
#: the public split behind the public-marginal normaliser of the empirical denoiser (empden.normaliser;
#: pipeline/privacy/empirical_denoiser.py): an input of every private cell, none for "constant"
EMPDEN_NORMALISER_INPUT = (
    {"public_data": DATA / "public.npz"} if config["empden"]["normaliser"] == "public_marginal" else {}
)
EMPDEN_SAMPLE_MEM_MB = cost.empden_sample_mem_mb(config)
EMPDEN_SAMPLE_RUNTIME_MIN = cost.empden_sample_runtime_min(config)
#: the empirical denoiser's normaliser settings (public_only cells ignore them)
EMPDEN_NORMALISER_PARAMS = {k: config["empden"][k] for k in ("normaliser", "normaliser_n")}


include: "functions/empden.smk"


register_targets("empden", empden_targets)
register_transcripts("empden", empden_ledger_claims)
register_runs("empden", empden_records)



rule empden_sample_subsampled:
    """One hybrid (Algorithm 1) or per-step (Prop. C.1) cell: samples + its ledger line."""
    input:
        unpack(lambda wildcards: EMPDEN_NORMALISER_INPUT),
        private=DATA / "private_train.npz",
        public=PUBLIC_DENOISER,
    output:
        samples=EMPDEN_SAMPLES / "{method}" / "p{p}_B{B}_T{T}_beta{beta}_s{seed}.npz",
        manifest=EMPDEN_SAMPLES / "{method}" / "p{p}_B{B}_T{T}_beta{beta}_s{seed}.json",
        ledger=EXPDIR / "ledger" / "empden_sample_{method}_p{p}_B{B}_T{T}_beta{beta}_s{seed}.jsonl",
    wildcard_constraints:
        method="hybrid|per_step",
        p=NUMBER_PATTERN,
        B="[0-9]+",
        T="[0-9]+",
        beta=NUMBER_PATTERN,
        seed="[0-9]+",
    params:
        p=lambda wildcards: empden_sample_params(wildcards.method, wildcards),
        norm_in=lambda wildcards, input: io_args("", {k: input[k] for k in EMPDEN_NORMALISER_INPUT}),
    log:
        LOGS / "empden_sample" / "{method}_p{p}_B{B}_T{T}_beta{beta}_s{seed}.log",
    benchmark:
        benchmark_path("empden_sample", "{method}/p{p}_B{B}_T{T}_beta{beta}_s{seed}")
    threads: TORCH_THREADS
    resources:
        gpu=1,
        mem_mb=EMPDEN_SAMPLE_MEM_MB,
        runtime=EMPDEN_SAMPLE_RUNTIME_MIN,
    conda:
        GPU_ENV
    shell:
        "python -m pipeline empden_sample --in private={input.private:q} public={input.public:q} {params.norm_in}"
        " --out samples={output.samples:q} ledger={output.ledger:q} --params {params.p:q} --log {log:q}"


rule empden_sample_full_batch:
    """One full-batch cell (every record at every step, down to sigma_min; Sec. 6.1, Figure 4)."""
    input:
        unpack(lambda wildcards: EMPDEN_NORMALISER_INPUT),
        private=DATA / "private_train.npz",
    output:
        samples=EMPDEN_SAMPLES / "full_batch" / "smin{smin}_beta{beta}_s{seed}.npz",
        manifest=EMPDEN_SAMPLES / "full_batch" / "smin{smin}_beta{beta}_s{seed}.json",
        ledger=EXPDIR / "ledger" / "empden_sample_full_batch_smin{smin}_beta{beta}_s{seed}.jsonl",
    wildcard_constraints:
        smin=NUMBER_PATTERN,
        beta=NUMBER_PATTERN,
        seed="[0-9]+",
    params:
        p=lambda wildcards: empden_sample_params("full_batch", wildcards),
        norm_in=lambda wildcards, input: io_args("", {k: input[k] for k in EMPDEN_NORMALISER_INPUT}),
    log:
        LOGS / "empden_sample" / "full_batch_smin{smin}_beta{beta}_s{seed}.log",
    benchmark:
        benchmark_path("empden_sample", "full_batch/smin{smin}_beta{beta}_s{seed}")
    threads: TORCH_THREADS
    resources:
        gpu=1,
        mem_mb=EMPDEN_SAMPLE_MEM_MB,
        runtime=EMPDEN_SAMPLE_RUNTIME_MIN,
    conda:
        GPU_ENV
    shell:
        "python -m pipeline empden_sample --in private={input.private:q} {params.norm_in}"
        " --out samples={output.samples:q} ledger={output.ledger:q} --params {params.p:q} --log {log:q}"


rule empden_sample_public_only:
    """The public denoiser alone (no private block, eps = 0): Table 2's reference row."""
    input:
        private=DATA / "private_train.npz",  # read for the image shape only
        public=PUBLIC_DENOISER,
    output:
        samples=EMPDEN_SAMPLES / "public_only" / "s{seed}.npz",
        manifest=EMPDEN_SAMPLES / "public_only" / "s{seed}.json",
    wildcard_constraints:
        seed="[0-9]+",
    params:
        p=lambda wildcards: empden_sample_params("public_only", wildcards),
    log:
        LOGS / "empden_sample" / "public_only_s{seed}.log",
    benchmark:
        benchmark_path("empden_sample", "public_only/s{seed}")
    threads: TORCH_THREADS
    resources:
        gpu=1,
        mem_mb=4000,
        runtime=EMPDEN_SAMPLE_RUNTIME_MIN,
    conda:
        GPU_ENV
    shell:
        "python -m pipeline empden_sample --in private={input.private:q} public={input.public:q}"
        " --out samples={output.samples:q} --params {params.p:q} --log {log:q}"


rule empden_evaluate:
    """Score one cell's samples with the evaluation core (FID/KID/precision-recall vs the test split; FID vs
    val, which chooses Table 2's best cell)."""
    input:
        unpack(clip_inputs),
        samples=EMPDEN_SAMPLES / "{cell}.npz",
        test=DATA / "test.npz",
        val=DATA / "val.npz",
        evalnet=EVALNET / "evalnet.pt",
    output:
        metrics=EXPDIR / "eval" / "empden" / "{cell}" / "metrics.json",
    wildcard_constraints:
        cell=CELL_PATTERN,
    params:
        p=lambda wildcards: params_json(evaluation=evaluation_params(), seed=SEED, device=config["device"],
                                        threads=TORCH_THREADS, name=f"empden/{wildcards.cell}"),
        clip=clip_arg,
    log:
        LOGS / "empden_evaluate" / "{cell}.log",
    benchmark:
        benchmark_path("empden_evaluate", "{cell}")
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


rule empden_table8_grid:
    """EMPDEN Tables 8/9: every cell with FID, PLD [eps_l, eps_u] and Edgeworth eps_ew."""
    input:
        unpack(lambda wildcards: empden_table8_inputs()),
    output:
        table=EMPDEN_TABLE8,
    params:
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
        p=stage_params(accounting={k: config["accounting"][k] for k in ACCOUNTING_EPS_KEYS}),
    benchmark:
        benchmark_path("empden_table8_grid")
    log:
        LOGS / "empden_table8_grid.log",
    threads: 1
    resources:
        mem_mb=ACCOUNTING_MEM_MB,
        runtime=ACCOUNTING_RUNTIME_MIN,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table8_grid {params.ins} --out table={output.table:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_table2_comparison:
    """EMPDEN Table 2: best hybrid cells against the public-only and full-private references, and the prior
    methods' rows (the baselines, DPDM) from their own runs when those methods are chosen."""
    input:
        unpack(empden_table2_prior_inputs),
        grid=EMPDEN_TABLE8,
    output:
        table=TABLES / "empden_table2_comparison.parquet",
    params:
        p=stage_params(beta=config["accounting"]["beta"]),
        prior=lambda wildcards, input: "".join(f" {k}={shlex.quote(str(input[k]))}" for k in ("baselines", "dpdm")
                                              if k in input.keys()),
    benchmark:
        benchmark_path("empden_table2_comparison")
    log:
        LOGS / "empden_table2_comparison.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table2_comparison --in grid={input.grid:q}{params.prior} --out table={output.table:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_table3_beta:
    """EMPDEN Table 3: the public normaliser beta against eps and FID."""
    input:
        grid=EMPDEN_TABLE8,
    output:
        table=TABLES / "empden_table3_beta.parquet",
    params:
        p=stage_params(beta_ablation=config["empden"]["beta_ablation"], seed=config["empden"]["seeds"][0]),
    benchmark:
        benchmark_path("empden_table3_beta")
    log:
        LOGS / "empden_table3_beta.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table3_beta --in grid={input.grid:q} --out table={output.table:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_table10_seeds:
    """EMPDEN Table 10: the handoff sweep at one (B, T), FID mean +- std over generation seeds."""
    input:
        grid=EMPDEN_TABLE8,
    output:
        table=TABLES / "empden_table10_seeds.parquet",
    params:
        p=stage_params(repeated_seeds=config["empden"]["repeated_seeds"], beta=config["accounting"]["beta"]),
    benchmark:
        benchmark_path("empden_table10_seeds")
    log:
        LOGS / "empden_table10_seeds.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table10_seeds --in grid={input.grid:q} --out table={output.table:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_figure3_tradeoffs:
    """EMPDEN Figure 3: FID against certified eps_u varying t0, T and q."""
    input:
        grid=EMPDEN_TABLE8,
    output:
        png=report_figure("empden_figure3_tradeoffs"),
        pdf=FIGURES / "empden_figure3_tradeoffs.pdf",
    params:
        p=stage_params(beta=config["accounting"]["beta"], seed=config["empden"]["seeds"][0]),
    benchmark:
        benchmark_path("empden_figure3_tradeoffs")
    log:
        LOGS / "empden_figure3_tradeoffs.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_figure3_tradeoffs --in grid={input.grid:q} --out figure={output.png:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_figure4_samples:
    """EMPDEN Figure 4 right: full-batch samples along the sigma_min sweep, with eps and FID."""
    input:
        unpack(lambda wildcards: {"grid": EMPDEN_TABLE8, **empden_figure4_inputs()}),
    output:
        png=report_figure("empden_figure4_samples"),
        pdf=FIGURES / "empden_figure4_samples.pdf",
    params:
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
        p=stage_params(n_images=config["empden"]["figure_images"]),
    benchmark:
        benchmark_path("empden_figure4_samples")
    log:
        LOGS / "empden_figure4_samples.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_figure4_samples {params.ins} --out figure={output.png:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_figure2_trajectories:
    """EMPDEN Figure 2: output-wise vs per-step trajectories from identical noise (its own ledger lines)."""
    input:
        unpack(lambda wildcards: EMPDEN_NORMALISER_INPUT),
        private=DATA / "private_train.npz",
        public=PUBLIC_DENOISER,
    output:
        png=report_figure("empden_figure2_trajectories"),
        pdf=FIGURES / "empden_figure2_trajectories.pdf",
        ledger=EMPDEN_FIGURE2_LEDGER,
    params:
        p=stage_params(figure2=config["empden"]["figure2"], accounting=ACCOUNTING_MECHANISM,
                      beta=config["accounting"]["beta"], seed=config["empden"]["seeds"][0], device=config["device"],
                      threads=TORCH_THREADS, ledger_binding=ledger_binding("empden_figure2_trajectories"),
                      **EMPDEN_NORMALISER_PARAMS),
        norm_in=lambda wildcards, input: io_args("", {k: input[k] for k in EMPDEN_NORMALISER_INPUT}),
    benchmark:
        benchmark_path("empden_figure2_trajectories")
    log:
        LOGS / "empden_figure2_trajectories.log",
    threads: TORCH_THREADS
    resources:
        gpu=1,
        mem_mb=EMPDEN_SAMPLE_MEM_MB,
        runtime=15,
    conda:
        GPU_ENV
    shell:
        "python -m pipeline empden_figure2_trajectories --in private={input.private:q} public={input.public:q}"
        " {params.norm_in}"
        " --out figure={output.png:q} ledger={output.ledger:q} --params {params.p:q} --log {log:q}"
