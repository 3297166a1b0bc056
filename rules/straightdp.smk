# STRAIGHTDP (Che, Xu & Wu 2026): a wrong-domain public set, the moment release (Stage 1), a
# rectified flow trained by uniform or THA DP-SGD (Stage 2), the shared evaluation, Tables 1, 5,
# 6, 7 and Figures 2a, 3, 5, 6 (the 2-D toy: pipeline/methods/straightdp/figure6_toy.py). Code:
# pipeline/methods/straightdp/stages.py (stages), pipeline/flow/public.py (import_straightdp: the user's SD3 folder),
# pipeline/methods/straightdp/table.py (tables, figures). Runs and
# their names: pipeline/methods/straightdp/runs.py; a run's files and params, the targets, transcripts
# and all_runs records: pipeline/methods/straightdp/wiring.py (STRAIGHTDP, unit-tested in
# tests/methods/straightdp/test_wiring.py); each rule's resources: its request in
# pipeline/methods/straightdp/costs.py (REQUESTS).
#
#   snakemake results/tables/straightdp_table1_main.parquet                  Table 1 alone
#   snakemake results/digits/models/straightdp/tha_moments_eps1_seed0.pt     one training run
#   snakemake results/digits/eval/straightdp/released_only_eps3_seed2/metrics.json
# Any run name works as a target (e.g. eps10 or seed5), not only those the tables use.

from pipeline.methods.straightdp.wiring import TABLE2_PANELS as _STRAIGHTDP_TABLE2_PANELS
from pipeline.methods.straightdp.wiring import TABLES as _STRAIGHTDP_TABLES
from pipeline.methods.straightdp.wiring import Wiring as _StraightdpWiring
from pipeline.methods.straightdp import runs as straightdp_runs

STRAIGHTDP = _StraightdpWiring(HOUSE)

register(STRAIGHTDP)


rule straightdp_public:
    """The wrong-domain public set (straightdp.public; printed letters by default), disjoint from every real split."""
    output:
        public=STRAIGHTDP.public_split,
        manifest=STRAIGHTDP.public_split.with_suffix(".json"),
    params:
        p=STRAIGHTDP.public_params(),
    benchmark:
        benchmark_path("straightdp_public")
    log:
        LOGS / "straightdp_public.log",
    threads: 1
    resources: **STRAIGHTDP.resources("straightdp_public")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline prepare_public --out public={output.public:q} --params {params.p:q} --log {log:q}"


rule train_autoencoder:
    """The latent variant's convolutional autoencoder, on the public set only, frozen (straightdp.space: latent)."""
    input:
        public=STRAIGHTDP.public_split,
    output:
        model=STRAIGHTDP.autoencoder(),
        metrics=STRAIGHTDP.autoencoder_metrics(),
    params:
        p=lambda wildcards: STRAIGHTDP.autoencoder_params(),
    benchmark:
        benchmark_path("train_autoencoder")
    log:
        LOGS / "train_autoencoder.log",
    threads: TORCH_THREADS
    resources: **STRAIGHTDP.resources("train_autoencoder")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline train_autoencoder --in public={input.public:q} --out model={output.model:q}"
        " metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule encode_split:
    """A split's codes under the frozen public autoencoder (the latent variant's private and public data)."""
    input:
        split=lambda wildcards: STRAIGHTDP.code_sources[wildcards.name],
        autoencoder=STRAIGHTDP.autoencoder(),
    output:
        codes=STRAIGHTDP.codes_path("{name}"),
    wildcard_constraints:
        name="|".join(STRAIGHTDP.code_sources),
    params:
        p=lambda wildcards: STRAIGHTDP.codes_params(wildcards.name),
    benchmark:
        benchmark_path("encode_split", "{name}")
    log:
        LOGS / "encode_split" / "{name}.log",
    threads: 1
    resources: **STRAIGHTDP.resources("encode_split")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline encode_split --in split={input.split:q} autoencoder={input.autoencoder:q}"
        " --out codes={output.codes:q} --params {params.p:q} --log {log:q}"


rule straightdp_geometry:
    """Public PCA basis + clip R of the release, Fig. 2a's cosine curve and the horizon tau (public only)."""
    input:
        public=STRAIGHTDP.public_data(),
    output:
        geometry=STRAIGHTDP.geometry(),
        horizon=STRAIGHTDP.horizon(),
    params:
        p=lambda wildcards: STRAIGHTDP.params(seed=SEED),
    benchmark:
        benchmark_path("straightdp_geometry")
    log:
        LOGS / "straightdp_geometry.log",
    threads: 1
    resources: **STRAIGHTDP.resources("straightdp_geometry")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline straightdp_geometry --in public={input.public:q} --out geometry={output.geometry:q}"
        " horizon={output.horizon:q} --params {params.p:q} --log {log:q}"


rule pretrain_straightdp:
    """The class-conditional MM-DiT flow pretrained on the public set by eq. 1 (no private data)."""
    input:
        public=STRAIGHTDP.public_data(),
    output:
        model=STRAIGHTDP.public_flow(),
    params:
        p=lambda wildcards: STRAIGHTDP.pretrain_params(),
    benchmark:
        benchmark_path("pretrain_straightdp")
    log:
        LOGS / "pretrain_straightdp.log",
    threads: TORCH_THREADS
    resources: **STRAIGHTDP.resources("pretrain_straightdp")
    retries: cost.segment_retries(config, STRAIGHTDP.pretrain_runtime_min)
    conda:
        GPU_ENV
    shell:
        "python -m pipeline pretrain_straightdp --in public={input.public:q} --out model={output.model:q}"
        " --params {params.p:q} --log {log:q}"


if STRAIGHTDP.imports_public_flow:

    rule import_straightdp:
        """The user's public flow (straightdp.pretrain.source diffusers): an SD3Transformer2DModel folder and its label
        embeddings, local files only (pipeline/flow/public.py); the arms still pretrain their own."""
        input:
            public=STRAIGHTDP.public_data(),
        output:
            model=STRAIGHTDP.public_flow(),
        params:
            p=lambda wildcards: STRAIGHTDP.import_params(),
        benchmark:
            benchmark_path("import_straightdp")
        log:
            LOGS / "import_straightdp.log",
        threads: 1
        resources: **STRAIGHTDP.resources("import_straightdp")
        conda:
            CPU_ENV
        shell:
            "python -m pipeline import_straightdp --in public={input.public:q} --out model={output.model:q}"
            " --params {params.p:q} --log {log:q}"

    # pretrain_straightdp stays defined (its arm variant below is built from it) but never makes the main flow
    ruleorder: import_straightdp > pretrain_straightdp


# An arm's own public files (straightdp.arms; its runs are <arm>-<row>_eps<eps>_seed<seed>): the same rules
# with the arm's section. Its public flow always (the backbone switches act from public pretraining on); its
# autoencoder, codes and release geometry only in another space than the main one (Wiring.own_geometry).
use rule train_autoencoder as train_autoencoder_arm with:
    output:
        model=STRAIGHTDP.autoencoder("{arm}"),
        metrics=STRAIGHTDP.autoencoder_metrics("{arm}"),
    wildcard_constraints:
        arm=straightdp_runs.ARM_PATTERN,
    params:
        p=lambda wildcards: STRAIGHTDP.autoencoder_params(wildcards.arm),
    benchmark:
        benchmark_path("train_autoencoder", "{arm}")
    log:
        LOGS / "train_autoencoder" / "{arm}.log",


use rule encode_split as encode_split_arm with:
    input:
        split=lambda wildcards: STRAIGHTDP.code_sources[wildcards.name],
        autoencoder=STRAIGHTDP.autoencoder("{arm}"),
    output:
        codes=STRAIGHTDP.codes_path("{name}", "{arm}"),
    wildcard_constraints:
        arm=straightdp_runs.ARM_PATTERN,
        name="|".join(STRAIGHTDP.code_sources),
    benchmark:
        benchmark_path("encode_split", "{arm}_{name}")
    log:
        LOGS / "encode_split" / "{arm}_{name}.log",


use rule straightdp_geometry as straightdp_geometry_arm with:
    input:
        public=lambda wildcards: STRAIGHTDP.public_data(wildcards.arm),
    output:
        geometry=STRAIGHTDP.arm_geometry("{arm}")[0],
        horizon=STRAIGHTDP.arm_geometry("{arm}")[1],
    wildcard_constraints:
        arm=straightdp_runs.ARM_PATTERN,
    params:
        p=lambda wildcards: STRAIGHTDP.params(arm=wildcards.arm, seed=SEED),
    benchmark:
        benchmark_path("straightdp_geometry", "{arm}")
    log:
        LOGS / "straightdp_geometry" / "{arm}.log",


use rule pretrain_straightdp as pretrain_straightdp_arm with:
    input:
        public=lambda wildcards: STRAIGHTDP.public_data(wildcards.arm),
    output:
        model=STRAIGHTDP.public_flow("{arm}"),
    wildcard_constraints:
        arm=straightdp_runs.ARM_PATTERN,
    params:
        p=lambda wildcards: STRAIGHTDP.pretrain_params(wildcards.arm),
    benchmark:
        benchmark_path("pretrain_straightdp", "{arm}")
    log:
        LOGS / "pretrain_straightdp" / "{arm}.log",


rule release_moments:
    """Stage 1 of one run (Prop. B.9): the noisy class moments at the run's Stage-1 share, its ledger line."""
    input:
        unpack(STRAIGHTDP.release_inputs),
    output:
        moments=STRAIGHTDP.release_path("{run}"),
        ledger=STRAIGHTDP.release_ledger("{run}"),
    wildcard_constraints:
        run=straightdp_runs.RUN_PATTERN,
    params:
        p=lambda wildcards: STRAIGHTDP.private_run_params(wildcards),
    log:
        LOGS / "release_moments" / "{run}.log",
    benchmark:
        benchmark_path("release_moments", "{run}")
    threads: 1
    resources: **STRAIGHTDP.resources("release_moments")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline release_moments --in data={input.data:q} geometry={input.geometry:q}"
        " --out moments={output.moments:q} ledger={output.ledger:q} --params {params.p:q} --log {log:q}"


rule train_straightdp:
    """Stage 2 of one run: [distil the release for t < tau], then uniform / THA DP-SGD composed to the run's eps."""
    input:
        unpack(STRAIGHTDP.train_inputs),
    output:
        model=STRAIGHTDP.model_path("{run}"),
        ledger=STRAIGHTDP.train_ledger("{run}"),
        metrics=STRAIGHTDP.train_metrics("{run}"),
    wildcard_constraints:
        run=straightdp_runs.RUN_PATTERN,
    params:
        p=lambda wildcards: STRAIGHTDP.private_run_params(wildcards, train=True),
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
    log:
        LOGS / "train_straightdp" / "{run}.log",
    benchmark:
        benchmark_path("train_straightdp", "{run}")
    threads: STRAIGHTDP.train_threads
    resources: **STRAIGHTDP.resources("train_straightdp")
    retries: cost.segment_retries(config, STRAIGHTDP.train_runtime_min)
    conda:
        GPU_ENV
    shell:
        "python -m pipeline --nproc {resources.gpu} train_straightdp {params.ins} --out model={output.model:q} ledger={output.ledger:q}"
        " metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule sample_straightdp:
    """Labelled samples of one run: from the release, the guided public flow, or the trained flow (post-processing)."""
    input:
        unpack(STRAIGHTDP.sample_inputs),
    output:
        samples=STRAIGHTDP.samples_path("{run}"),
        manifest=STRAIGHTDP.samples_manifest("{run}"),
    wildcard_constraints:
        run=straightdp_runs.RUN_PATTERN,
    params:
        p=lambda wildcards: STRAIGHTDP.sample_params(wildcards),
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
    log:
        LOGS / "sample_straightdp" / "{run}.log",
    benchmark:
        benchmark_path("sample_straightdp", "{run}")
    threads: TORCH_THREADS
    resources: **STRAIGHTDP.resources("sample_straightdp")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline sample_straightdp {params.ins} --out samples={output.samples:q} --params {params.p:q}"
        " --log {log:q}"


rule evaluate_straightdp:
    """Score one run's samples with the evaluation core, plus Table 5's domain rate against the public set."""
    input:
        unpack(clip_inputs),
        samples=STRAIGHTDP.samples_path("{run}"),
        test=DATA / "test.npz",
        evalnet=EVALNET / "evalnet.pt",
        public=STRAIGHTDP.public_split,
    output:
        metrics=STRAIGHTDP.metrics_path("{run}"),
    wildcard_constraints:
        run=straightdp_runs.RUN_PATTERN,
    params:
        p=lambda wildcards: STRAIGHTDP.evaluate_params(wildcards.run, evaluation_params()),
        clip=clip_arg,
    log:
        LOGS / "evaluate_straightdp" / "{run}.log",
    benchmark:
        benchmark_path("evaluate_straightdp", "{run}")
    threads: TORCH_THREADS
    resources: **STRAIGHTDP.resources("evaluate_straightdp")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline evaluate_samples --in samples={input.samples:q} test={input.test:q}"
        " evalnet={input.evalnet:q} public={input.public:q}{params.clip} --out metrics={output.metrics:q}"
        " --params {params.p:q}"
        " --log {log:q}"


rule straightdp_table:
    """STRAIGHTDP Table 1 (main), 3 (frozen-model route), 5 (per class), 6 (FID vs eps), 7 (precision/recall):
    mean/std over seeds, certified eps of Composed([release, THA]) recomputed from the transcripts."""
    input:
        unpack(lambda wildcards: STRAIGHTDP.table_inputs(wildcards.table)),
    output:
        table=STRAIGHTDP.table_path("{table}"),
    wildcard_constraints:
        table="|".join(_STRAIGHTDP_TABLES),
    params:
        p=lambda wildcards: STRAIGHTDP.table_params(table=wildcards.table),
        ins=lambda wildcards: io_args("--in", STRAIGHTDP.table_inputs(wildcards.table)),
    benchmark:
        benchmark_path("straightdp_table", "{table}")
    log:
        LOGS / "straightdp_{table}.log",
    threads: 1
    resources: **STRAIGHTDP.resources("straightdp_table")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline straightdp_table {params.ins} --out table={output.table:q} --params {params.p:q}"
        " --log {log:q}"


rule straightdp_table2:
    """STRAIGHTDP Table 2: the noise sweep (the constrained arm vs the main runs over eps, signed gain, gradient-norm
    tail ratio) or the single-factor ablation at the smallest eps (each ablation arm vs the main runs)."""
    input:
        unpack(lambda wildcards: STRAIGHTDP.table2_inputs(wildcards.panel)),
    output:
        table=STRAIGHTDP.table_path("table2_{panel}"),
    wildcard_constraints:
        panel="|".join(_STRAIGHTDP_TABLE2_PANELS),
    params:
        p=lambda wildcards: STRAIGHTDP.table2_params(wildcards.panel),
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
    benchmark:
        benchmark_path("straightdp_table2", "{panel}")
    log:
        LOGS / "straightdp_table2_{panel}.log",
    threads: 1
    resources: **STRAIGHTDP.resources("straightdp_table2")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline straightdp_table2 {params.ins} --out table={output.table:q} --params {params.p:q}"
        " --log {log:q}"


rule straightdp_figure_accuracy:
    """STRAIGHTDP Figure 3: downstream CNN accuracy vs eps per row, +-1 std over seeds."""
    input:
        unpack(lambda wildcards: STRAIGHTDP.table_inputs()),
    output:
        png=report_figure("straightdp_figure3_accuracy"),
        pdf=STRAIGHTDP.figure_path("figure3_accuracy", ".pdf"),
    params:
        p=lambda wildcards: STRAIGHTDP.table_params(),
        ins=lambda wildcards: io_args("--in", STRAIGHTDP.table_inputs()),
    benchmark:
        benchmark_path("straightdp_figure_accuracy")
    log:
        LOGS / "straightdp_figure3_accuracy.log",
    threads: 1
    resources: **STRAIGHTDP.resources("straightdp_figure_accuracy")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline straightdp_figure_accuracy {params.ins} --out figure={output.png:q} --params {params.p:q}"
        " --log {log:q}"


rule straightdp_figure6_toy:
    """STRAIGHTDP Figure 6: the 2-D mixture control end to end (moments only, uniform DP-SGD, StraightDP), W2 vs eps."""
    input:
        toy=DATA / "toy.npz",
    output:
        table=STRAIGHTDP.table_path("figure6_toy"),
        png=report_figure("straightdp_figure6_toy"),
        pdf=STRAIGHTDP.figure_path("figure6_toy", ".pdf"),
        ledger=STRAIGHTDP.toy_ledger,
    params:
        p=lambda wildcards: STRAIGHTDP.toy_params(),
    benchmark:
        benchmark_path("straightdp_figure6_toy")
    log:
        LOGS / "straightdp_figure6_toy.log",
    threads: 1
    resources: **STRAIGHTDP.resources("straightdp_figure6_toy")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline straightdp_figure6_toy --in toy={input.toy:q} --out table={output.table:q}"
        " figure={output.png:q} ledger={output.ledger:q} --params {params.p:q} --log {log:q}"


rule straightdp_figure_horizon:
    """STRAIGHTDP Figure 2a: cosine of the released vs the empirical field over t on public data, tau marked."""
    input:
        horizon=STRAIGHTDP.horizon(),
    output:
        png=report_figure("straightdp_figure2_horizon"),
        pdf=STRAIGHTDP.figure_path("figure2_horizon", ".pdf"),
    benchmark:
        benchmark_path("straightdp_figure_horizon")
    log:
        LOGS / "straightdp_figure2_horizon.log",
    threads: 1
    resources: **STRAIGHTDP.resources("straightdp_figure_horizon")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline straightdp_figure_horizon --in horizon={input.horizon:q} --out figure={output.png:q}"
        " --log {log:q}"


rule straightdp_figure_samples:
    """STRAIGHTDP Figure 5: samples of every Table 1 row at the largest eps (first seed), one row per class."""
    input:
        unpack(lambda wildcards: STRAIGHTDP.grid_inputs()),
    output:
        png=report_figure("straightdp_figure5_samples"),
        pdf=STRAIGHTDP.figure_path("figure5_samples", ".pdf"),
    params:
        ins=lambda wildcards: io_args("--in", STRAIGHTDP.grid_inputs()),
        p=lambda wildcards: STRAIGHTDP.grid_params(),
    benchmark:
        benchmark_path("straightdp_figure_samples")
    log:
        LOGS / "straightdp_figure5_samples.log",
    threads: 1
    resources: **STRAIGHTDP.resources("straightdp_figure_samples")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dpdm_sample_grid {params.ins} --out figure={output.png:q} --params {params.p:q}"
        " --log {log:q}"


rule straightdp_table4_text:
    """STRAIGHTDP Table 4, Stage 1 only: the text-conditional release on composed-MNIST per caption featurisation."""
    input:
        private=DATA / "private_train.npz",
        public=STRAIGHTDP.public_split,
        heldout=DATA / "eval_train.npz",
        evalnet=EVALNET / "evalnet.pt",
    output:
        table=STRAIGHTDP.table_path("table4_text"),
        ledger=STRAIGHTDP.table4_ledger,
    params:
        # only what the release reads: a flow or DP-SGD setting does not rerun it
        p=lambda wildcards: STRAIGHTDP.table4_params(),
    benchmark:
        benchmark_path("straightdp_table4_text")
    log:
        LOGS / "straightdp_table4_text.log",
    threads: 1
    resources: **STRAIGHTDP.resources("straightdp_table4_text")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline straightdp_table4_text --in private={input.private:q} public={input.public:q}"
        " heldout={input.heldout:q} evalnet={input.evalnet:q} --out table={output.table:q}"
        " ledger={output.ledger:q} --params {params.p:q} --log {log:q}"
