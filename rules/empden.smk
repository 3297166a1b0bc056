# EMPDEN sampling grid (Sec. 6, App. J): one target path per cell, then the evaluation core,
# then Tables 2, 3, 8/9, 10 and Figures 2, 3, 4 right.
# Code: pipeline/methods/empden/sample_stage.py (sampling), pipeline/methods/empden/results.py
# (tables, figures); cells and their names: pipeline/methods/empden/grid.py; each rule's resources:
# pipeline/methods/empden/costs.py (a sampling job's runtime: its own cell's counted work).
#
#   snakemake results/digits/samples/empden/hybrid/p50_B100_T3_beta1_s0.npz     one cell
#   snakemake results/digits/eval/empden/hybrid/p50_B100_T3_beta1_s0/metrics.json
# Numbers in paths have no dots: beta 0.5 is beta0p5, sigma_min 0.002 is smin0p002.

from pipeline.runs import NUMBER_PATTERN
from pipeline.methods.empden.grid import CELL_PATTERN
from pipeline.methods.empden.wiring import Wiring as _EmpdenWiring

#: EMPDEN's cells, paths and params (pipeline/methods/empden/wiring.py)
EMPDEN = _EmpdenWiring(HOUSE)

register(EMPDEN)


rule empden_sample_subsampled:
    """One hybrid (Algorithm 1) or per-step (Prop. C.1) cell: samples + its ledger line."""
    input:
        unpack(lambda wildcards: EMPDEN.normaliser_input),
        private=DATA / "private_train.npz",
        public=PUBLIC_DENOISER,
    output:
        **EMPDEN.sample_outputs("{method}/p{p}_B{B}_T{T}_beta{beta}_s{seed}"),
    wildcard_constraints:
        method="hybrid|per_step",
        p=NUMBER_PATTERN,
        B="[0-9]+",
        T="[0-9]+",
        beta=NUMBER_PATTERN,
        seed="[0-9]+",
    params:
        p=lambda wildcards: EMPDEN.sample_params(wildcards.method, wildcards),
        norm_in=EMPDEN.normaliser_args,
    log:
        EMPDEN.sample_log(LOGS, "{method}_p{p}_B{B}_T{T}_beta{beta}_s{seed}"),
    benchmark:
        benchmark_path("empden_sample", EMPDEN.sample_job("{method}/p{p}_B{B}_T{T}_beta{beta}_s{seed}"))
    threads: TORCH_THREADS
    resources: **EMPDEN.resources("empden_sample_subsampled")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline empden_sample --in private={input.private:q} public={input.public:q} {params.norm_in}"
        " --out samples={output.samples:q} ledger={output.ledger:q} --params {params.p:q} --log {log:q}"


rule empden_sample_full_batch:
    """One full-batch cell (every record at every step, down to sigma_min; Sec. 6.1, Figure 4)."""
    input:
        unpack(lambda wildcards: EMPDEN.normaliser_input),
        private=DATA / "private_train.npz",
    output:
        **EMPDEN.sample_outputs("full_batch/smin{smin}_beta{beta}_s{seed}"),
    wildcard_constraints:
        smin=NUMBER_PATTERN,
        beta=NUMBER_PATTERN,
        seed="[0-9]+",
    params:
        p=lambda wildcards: EMPDEN.sample_params("full_batch", wildcards),
        norm_in=EMPDEN.normaliser_args,
    log:
        EMPDEN.sample_log(LOGS, "full_batch_smin{smin}_beta{beta}_s{seed}"),
    benchmark:
        benchmark_path("empden_sample", EMPDEN.sample_job("full_batch/smin{smin}_beta{beta}_s{seed}"))
    threads: TORCH_THREADS
    resources: **EMPDEN.resources("empden_sample_full_batch")
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
        **EMPDEN.sample_outputs("public_only/s{seed}", private=False),
    wildcard_constraints:
        seed="[0-9]+",
    params:
        p=lambda wildcards: EMPDEN.sample_params("public_only", wildcards),
    log:
        EMPDEN.sample_log(LOGS, "public_only_s{seed}"),
    benchmark:
        benchmark_path("empden_sample", EMPDEN.sample_job("public_only/s{seed}"))
    threads: TORCH_THREADS
    resources: **EMPDEN.resources("empden_sample_public_only")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline empden_sample --in private={input.private:q} public={input.public:q}"
        " --out samples={output.samples:q} --params {params.p:q} --log {log:q}"


if EMPDEN.sharded:

    rule empden_gather:
        """A sharded cell's shards joined (sampling.shards): its samples, bit-equal to one job's, and its
        transcript of one line per shard, each written by its shard (pipeline/shards.py)."""
        input:
            unpack(EMPDEN.gather_inputs),
        output:
            samples=EMPDEN.samples / "{method}" / "{rest}.npz",
            manifest=EMPDEN.samples / "{method}" / "{rest}.json",
            ledger=EXPDIR / "ledger" / "empden_sample_{method}_{rest}.jsonl",
        wildcard_constraints:
            method="hybrid|per_step|full_batch",
            rest="[^/]+",
        params:
            ins=lambda wildcards, input: io_args("--in", dict(input.items())),
            outs=lambda wildcards, output: io_args("--out", {k: v for k, v in output.items() if k != "manifest"}),
            p=EMPDEN.gather_params,
        log:
            LOGS / "empden_gather" / "{method}_{rest}.log",
        benchmark:
            benchmark_path("empden_gather", "{method}/{rest}")
        threads: 1
        resources: **EMPDEN.resources("empden_gather")
        conda:
            CPU_ENV
        shell:
            "python -m pipeline empden_gather {params.ins} {params.outs} --params {params.p:q} --log {log:q}"

    use rule empden_gather as empden_gather_public_only with:
        output:
            samples=EMPDEN.samples / "{method}" / "{rest}.npz",
            manifest=EMPDEN.samples / "{method}" / "{rest}.json",
        wildcard_constraints:
            method="public_only",
            rest="[^/]+",

    rule empden_features:
        """One shard's features in the evaluation's feature space (FID/KID/precision-recall merge them)."""
        input:
            samples=EMPDEN.samples / "shards" / "{cell}" / "{shard}.npz",
            evalnet=EVALUATION.evalnet_model,
        output:
            features=EXPDIR / "eval" / "empden" / "shards" / "{cell}" / "{shard}.features.npz",
        wildcard_constraints:
            cell=CELL_PATTERN,
            shard="[0-9]+",
        params:
            p=EVALUATION.features_params(),
        log:
            LOGS / "empden_features" / "{cell}" / "{shard}.log",
        benchmark:
            benchmark_path("empden_features", "{cell}/shard{shard}")
        threads: TORCH_THREADS
        resources: **EMPDEN.resources("empden_features")
        conda:
            GPU_ENV
        shell:
            "python -m pipeline extract_features --in samples={input.samples:q} evalnet={input.evalnet:q}"
            " --out features={output.features:q} --params {params.p:q} --log {log:q}"


rule empden_evaluate:
    """Score one cell's samples with the evaluation core (FID/KID/precision-recall vs the test split; FID vs
    val, which chooses Table 2's best cell); sharded, from its shards' features."""
    input:
        unpack(EVALUATION.clip_inputs),
        unpack(EMPDEN.features_inputs),
        samples=EMPDEN.samples / "{cell}.npz",
        test=DATA / "test.npz",
        val=DATA / "val.npz",
        evalnet=EVALUATION.evalnet_model,
    output:
        metrics=EXPDIR / "eval" / "empden" / "{cell}" / "metrics.json",
    wildcard_constraints:
        cell=CELL_PATTERN,
    params:
        p=lambda wildcards: EVALUATION.evaluate_params(f"empden/{wildcards.cell}"),
        # the CLIP model and, sharded, the shards' features ("" where neither applies); one param, so that an
        # unsharded job's command and params are what they were before sharding existed (nothing reruns)
        clip=lambda wildcards, input: EVALUATION.clip_arg(wildcards, input) + EMPDEN.features_args(wildcards, input),
    log:
        LOGS / "empden_evaluate" / "{cell}.log",
    benchmark:
        benchmark_path("empden_evaluate", "{cell}")
    threads: TORCH_THREADS
    resources: **EMPDEN.resources("empden_evaluate")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline evaluate_samples --in samples={input.samples:q} test={input.test:q} val={input.val:q}"
        " evalnet={input.evalnet:q}{params.clip} --out metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule empden_table8_grid:
    """EMPDEN Tables 8/9: every cell with FID, PLD [eps_l, eps_u] and Edgeworth eps_ew."""
    input:
        unpack(lambda wildcards: EMPDEN.table8_inputs()),
    output:
        table=EMPDEN.table8,
    params:
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
        p=EMPDEN.table8_params(),
    benchmark:
        benchmark_path("empden_table8_grid")
    log:
        LOGS / "empden_table8_grid.log",
    threads: 1
    resources: **EMPDEN.resources("empden_table8_grid")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table8_grid {params.ins} --out table={output.table:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_table2_comparison:
    """EMPDEN Table 2: best hybrid cells against the public-only and full-private references, and the prior
    methods' rows (the baselines, DPDM) from their own runs when those methods are chosen."""
    input:
        unpack(EMPDEN.table2_prior_inputs),
        grid=EMPDEN.table8,
    output:
        table=TABLES / "empden_table2_comparison.parquet",
    params:
        p=EMPDEN.table2_params(),
        prior=EMPDEN.table2_prior_args,
    benchmark:
        benchmark_path("empden_table2_comparison")
    log:
        LOGS / "empden_table2_comparison.log",
    threads: 1
    resources: **EMPDEN.resources("empden_table2_comparison")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table2_comparison --in grid={input.grid:q}{params.prior} --out table={output.table:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_table3_beta:
    """EMPDEN Table 3: the public normaliser beta against eps and FID."""
    input:
        grid=EMPDEN.table8,
    output:
        table=TABLES / "empden_table3_beta.parquet",
    params:
        p=EMPDEN.table3_params(),
    benchmark:
        benchmark_path("empden_table3_beta")
    log:
        LOGS / "empden_table3_beta.log",
    threads: 1
    resources: **EMPDEN.resources("empden_table3_beta")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table3_beta --in grid={input.grid:q} --out table={output.table:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_table10_seeds:
    """EMPDEN Table 10: the handoff sweep at one (B, T), FID mean +- std over generation seeds."""
    input:
        grid=EMPDEN.table8,
    output:
        table=TABLES / "empden_table10_seeds.parquet",
    params:
        p=EMPDEN.table10_params(),
    benchmark:
        benchmark_path("empden_table10_seeds")
    log:
        LOGS / "empden_table10_seeds.log",
    threads: 1
    resources: **EMPDEN.resources("empden_table10_seeds")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table10_seeds --in grid={input.grid:q} --out table={output.table:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_figure3_tradeoffs:
    """EMPDEN Figure 3: FID against certified eps_u varying t0, T and q."""
    input:
        grid=EMPDEN.table8,
    output:
        png=report_figure("empden_figure3_tradeoffs"),
        pdf=FIGURES / "empden_figure3_tradeoffs.pdf",
    params:
        p=EMPDEN.figure3_params(),
    benchmark:
        benchmark_path("empden_figure3_tradeoffs")
    log:
        LOGS / "empden_figure3_tradeoffs.log",
    threads: 1
    resources: **EMPDEN.resources("empden_figure3_tradeoffs")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_figure3_tradeoffs --in grid={input.grid:q} --out figure={output.png:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_figure4_samples:
    """EMPDEN Figure 4 right: full-batch samples along the sigma_min sweep, with eps and FID."""
    input:
        unpack(lambda wildcards: {"grid": EMPDEN.table8, **EMPDEN.figure4_inputs()}),
    output:
        png=report_figure("empden_figure4_samples"),
        pdf=FIGURES / "empden_figure4_samples.pdf",
    params:
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
        p=EMPDEN.figure4_params(),
    benchmark:
        benchmark_path("empden_figure4_samples")
    log:
        LOGS / "empden_figure4_samples.log",
    threads: 1
    resources: **EMPDEN.resources("empden_figure4_samples")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_figure4_samples {params.ins} --out figure={output.png:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_figure2_trajectories:
    """EMPDEN Figure 2: output-wise vs per-step trajectories from identical noise (its own ledger lines)."""
    input:
        unpack(lambda wildcards: EMPDEN.normaliser_input),
        private=DATA / "private_train.npz",
        public=PUBLIC_DENOISER,
    output:
        png=report_figure("empden_figure2_trajectories"),
        pdf=FIGURES / "empden_figure2_trajectories.pdf",
        ledger=EMPDEN.figure2_ledger,
    params:
        p=EMPDEN.figure2_params(),
        norm_in=EMPDEN.normaliser_args,
    benchmark:
        benchmark_path("empden_figure2_trajectories")
    log:
        LOGS / "empden_figure2_trajectories.log",
    threads: TORCH_THREADS
    resources: **EMPDEN.resources("empden_figure2_trajectories")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline empden_figure2_trajectories --in private={input.private:q} public={input.public:q}"
        " {params.norm_in}"
        " --out figure={output.png:q} ledger={output.ledger:q} --params {params.p:q} --log {log:q}"
