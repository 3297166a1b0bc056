# Baselines under the same protocol: DP-MERF (one noisy RFF mean embedding, a generator matched to it),
# its successors DP-HP, DP-NTK and DP-MEPF (the same release and generator over Hermite, e-NTK and
# public perceptual features; pipeline/baselines/embedding_family.py) and Private Evolution (noisy
# nearest-neighbour votes steering the public EDM denoiser), DP-Diffusion (the public denoiser fine-tuned by the
# DP-SGD engine with augmentation multiplicity: stages train_dpdm and sample_dpdm), PrivImage (a DP semantic
# histogram chooses public data to pretrain on: stages privimage_query_net, privimage_select, pretrain_public, then
# train_dpdm and sample_dpdm), DP-LDM (train_autoencoder and encode_split on public data, pretrain_public on the
# codes, train_dpdm of the attention and conditioning on the private codes, sample_dpdm, dp_ldm_decode) and
# DP-Promise's certified variant (train_dpdm on the high noise levels, then on the low, composed), scored by
# the shared evaluation, certified by the same ledger. Code:
# pipeline/baselines/ (stages), pipeline/privacy/dp_merf.py, mean_embedding.py, private_evolution.py and
# semantic_histogram.py (mechanisms),
# pipeline/results/baselines.py (table). Runs and names: pipeline/baselines/runs.py. Each rule's resources:
# pipeline/methods/baselines/costs.py (the engines they share: DPDM's and the public pretraining's costs).
#
#   snakemake results/tables/baselines.parquet                         the table
#   snakemake results/digits/eval/baselines/pe_eps1_seed0/metrics.json one run, evaluated

from pipeline.baselines import runs as _baseline_runs
from pipeline.methods.baselines import wiring as _baselines_wiring
from pipeline.methods.baselines.wiring import Wiring as _BaselinesWiring

#: the baselines' runs, paths and params (pipeline/methods/baselines/wiring.py)
BASELINES = _BaselinesWiring(HOUSE, EVALUATION)

register(BASELINES)


rule dp_merf:
    """DP-MERF: the class-conditional RFF mean embedding released once (Gaussian, sensitivity 2/m), a generator fit to it."""
    input:
        data=DATA / "private_train.npz",
        public=DATA / "public.npz",
    output:
        samples=BASELINES.samples_path("{run}"),
        manifest=BASELINES.manifest_path("{run}"),
        ledger=BASELINES.ledger_path("{run}"),
        metrics=BASELINES.train_metrics_path("{run}"),
        generator=BASELINES.generator_path("{run}"),
    wildcard_constraints:
        run=_baseline_runs.method_pattern("dp_merf"),
    params:
        p=BASELINES.params,
    log:
        LOGS / "baselines" / "{run}.log",
    benchmark:
        benchmark_path("dp_merf", "{run}")
    threads: TORCH_THREADS
    resources: **BASELINES.resources("dp_merf")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline dp_merf --in data={input.data:q} public={input.public:q} --out samples={output.samples:q}"
        " ledger={output.ledger:q} metrics={output.metrics:q} generator={output.generator:q} --params {params.p:q}"
        " --log {log:q}"


rule embedding_baseline:
    """DP-HP, DP-NTK or DP-MEPF: one Gaussian release of the class-conditional mean embedding of features of norm <= 1
    (sensitivity 2/m), DP-MERF's generator fitted to it."""
    input:
        unpack(BASELINES.embedding_inputs),
    output:
        samples=BASELINES.samples_path("{run}"),
        manifest=BASELINES.manifest_path("{run}"),
        ledger=BASELINES.ledger_path("{run}"),
        metrics=BASELINES.train_metrics_path("{run}"),
        generator=BASELINES.generator_path("{run}"),
    wildcard_constraints:
        run=_baseline_runs.methods_pattern(_baseline_runs.EMBEDDING_FAMILY),
    params:
        p=BASELINES.params,
        stage=BASELINES.stage,
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
    log:
        LOGS / "baselines" / "{run}.log",
    benchmark:
        benchmark_path("embedding_baseline", "{run}")
    threads: TORCH_THREADS
    resources: **BASELINES.resources("embedding_baseline")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline {params.stage} {params.ins} --out samples={output.samples:q} ledger={output.ledger:q}"
        " metrics={output.metrics:q} generator={output.generator:q} --params {params.p:q} --log {log:q}"


rule private_evolution:
    """Private Evolution: T noisy nearest-neighbour vote histograms (Gaussian, sensitivity 1) over the public denoiser."""
    input:
        unpack(BASELINES.pe_inputs),
        data=DATA / "private_train.npz",
        denoiser=PUBLIC_DENOISER,
    output:
        samples=BASELINES.samples_path("{run}"),
        manifest=BASELINES.manifest_path("{run}"),
        ledger=BASELINES.ledger_path("{run}"),
        metrics=BASELINES.train_metrics_path("{run}"),
    wildcard_constraints:
        run=_baseline_runs.method_pattern("pe"),
    params:
        p=BASELINES.params,
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
    log:
        LOGS / "baselines" / "{run}.log",
    benchmark:
        benchmark_path("private_evolution", "{run}")
    threads: TORCH_THREADS
    resources: **BASELINES.resources("private_evolution")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline private_evolution {params.ins} --out samples={output.samples:q}"
        " ledger={output.ledger:q} metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule privimage_query_net:
    """PrivImage's semantic query function: a classifier of the public pool's semantics (public data only)."""
    input:
        unpack(BASELINES.pool_inputs),
    output:
        model=BASELINES.query_net_path,
        metrics=BASELINES.query_net_metrics_path,
    params:
        p=BASELINES.query_net_params(),
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
    log:
        LOGS / "baselines" / "privimage_query_net.log",
    benchmark:
        benchmark_path("privimage_query_net")
    threads: TORCH_THREADS
    resources: **BASELINES.resources("privimage_query_net")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline privimage_query_net {params.ins} --out model={output.model:q}"
        " metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule privimage_select:
    """PrivImage's semantic query: the noisy class-by-semantics histogram (its ledger line), the public images chosen."""
    input:
        unpack(BASELINES.select_inputs),
    output:
        selected=BASELINES.selected_path("{run}"),
        ledger=BASELINES.query_ledger_path("{run}"),
        metrics=BASELINES.query_metrics_path("{run}"),
    wildcard_constraints:
        run=_baseline_runs.method_pattern("privimage"),
    params:
        p=BASELINES.select_params,
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
    log:
        LOGS / "baselines" / "{run}_query.log",
    benchmark:
        benchmark_path("privimage_select", "{run}")
    threads: TORCH_THREADS
    resources: **BASELINES.resources("privimage_select")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline privimage_select {params.ins} --out selected={output.selected:q}"
        " ledger={output.ledger:q} metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule privimage_pretrain:
    """PrivImage's public denoiser: stage pretrain_public on the public images its query chose (no private record)."""
    input:
        public=BASELINES.selected_path("{run}"),
    output:
        model=BASELINES.pretrained_path("{run}"),
        metrics=BASELINES.pretrain_metrics_path("{run}"),
    wildcard_constraints:
        run=_baseline_runs.method_pattern("privimage"),
    params:
        p=BASELINES.pretrain_params,
    log:
        LOGS / "baselines" / "{run}_public.log",
    benchmark:
        benchmark_path("privimage_pretrain", "{run}")
    threads: TORCH_THREADS
    resources: **BASELINES.resources("privimage_pretrain")
    retries: cost.segment_retries(config, cost.pretrain_runtime_min(config))
    conda:
        GPU_ENV
    shell:
        "python -m pipeline pretrain_public --in public={input.public:q}"
        " --out model={output.model:q} metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule dp_ldm_autoencoder:
    """DP-LDM's autoencoder: stage train_autoencoder on the public split only, frozen."""
    input:
        public=DATA / "public.npz",
    output:
        model=BASELINES.ldm_autoencoder_path,
        metrics=BASELINES.ldm_autoencoder_metrics_path,
    params:
        p=BASELINES.ldm_autoencoder_params(),
    log:
        LOGS / "baselines" / "dp_ldm_autoencoder.log",
    benchmark:
        benchmark_path("dp_ldm_autoencoder")
    threads: TORCH_THREADS
    resources: **BASELINES.resources("dp_ldm_autoencoder")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline train_autoencoder --in public={input.public:q} --out model={output.model:q}"
        " metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule dp_ldm_encode:
    """A split's codes under DP-LDM's public autoencoder: the public one (its latent denoiser's pretraining) and the
    private one (read by DP-SGD only)."""
    input:
        split=BASELINES.ldm_code_source,
        autoencoder=BASELINES.ldm_autoencoder_path,
    output:
        codes=BASELINES.ldm_codes_path("{name}"),
    wildcard_constraints:
        name="|".join(_baselines_wiring.DP_LDM_CODES),
    params:
        p=BASELINES.ldm_codes_params,
    log:
        LOGS / "baselines" / "dp_ldm_encode_{name}.log",
    benchmark:
        benchmark_path("dp_ldm_encode", "{name}")
    threads: 1
    resources: **BASELINES.resources("dp_ldm_encode")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline encode_split --in split={input.split:q} autoencoder={input.autoencoder:q}"
        " --out codes={output.codes:q} --params {params.p:q} --log {log:q}"


rule dp_ldm_pretrain:
    """DP-LDM's latent denoiser: stage pretrain_public on the public split's codes (no private record)."""
    input:
        public=BASELINES.ldm_codes_path("public"),
    output:
        model=BASELINES.ldm_denoiser_path,
        metrics=BASELINES.ldm_denoiser_metrics_path,
    params:
        p=lambda wildcards: BASELINES.ldm_pretrain_params(),
    log:
        LOGS / "baselines" / "dp_ldm_pretrain.log",
    benchmark:
        benchmark_path("dp_ldm_pretrain")
    threads: TORCH_THREADS
    resources: **BASELINES.resources("dp_ldm_pretrain")
    retries: cost.segment_retries(config, cost.pretrain_runtime_min(config))
    conda:
        GPU_ENV
    shell:
        "python -m pipeline pretrain_public --in public={input.public:q}"
        " --out model={output.model:q} metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule dp_promise_phase1:
    """DP-Promise's phase I (certified variant): DP-SGD of the public denoiser on the noise levels sigma >= sigma_split,
    a share of the run's eps (stage train_dpdm); phase II (rule dpsgd_baseline) starts from it and composes it in."""
    input:
        unpack(BASELINES.phase1_inputs),
    output:
        model=BASELINES.phase1_path("{run}"),
        ledger=BASELINES.phase1_ledger_path("{run}"),
        metrics=BASELINES.phase1_metrics_path("{run}"),
    wildcard_constraints:
        run=_baseline_runs.method_pattern("dp_promise"),
    params:
        p=BASELINES.phase1_params,
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
    log:
        LOGS / "baselines" / "{run}_phase1.log",
    benchmark:
        benchmark_path("dp_promise_phase1", "{run}")
    threads: TORCH_THREADS
    resources: **BASELINES.resources("dp_promise_phase1")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline train_dpdm {params.ins} --out model={output.model:q} ledger={output.ledger:q}"
        " metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule dpsgd_baseline:
    """DP-Diffusion (the public denoiser, augmentation multiplicity), PrivImage (its own pretrained denoiser, its
    query composed in), DP-LDM (the latent denoiser's attention and conditioning, on the private codes) or DP-Promise's
    phase II (from its phase I, the low noise levels, phase I composed in): DP-SGD fine-tuning, stage train_dpdm."""
    input:
        unpack(BASELINES.dpsgd_inputs),
    output:
        model=BASELINES.denoiser_path("{run}"),
        ledger=BASELINES.ledger_path("{run}"),
        metrics=BASELINES.train_metrics_path("{run}"),
    wildcard_constraints:
        run=_baseline_runs.methods_pattern(_baseline_runs.DPSGD_FAMILY),
    params:
        p=BASELINES.dpsgd_params,
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
    log:
        LOGS / "baselines" / "{run}.log",
    benchmark:
        benchmark_path("dpsgd_baseline", "{run}")
    threads: TORCH_THREADS
    resources: **BASELINES.resources("dpsgd_baseline")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline train_dpdm {params.ins} --out model={output.model:q} ledger={output.ledger:q}"
        " metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule sample_baseline:
    """Samples of a DP-SGD baseline's denoiser with its sampler (post-processing: no ledger line)."""
    input:
        denoiser=BASELINES.denoiser_path("{run}"),
    output:
        samples=BASELINES.samples_path("{run}"),
        manifest=BASELINES.manifest_path("{run}"),
    wildcard_constraints:
        run=_baseline_runs.methods_pattern(_baselines_wiring.PIXEL_DPSGD),
    params:
        p=BASELINES.dpsgd_sample_params,
    log:
        LOGS / "sample_baseline" / "{run}.log",
    benchmark:
        benchmark_path("sample_baseline", "{run}")
    threads: TORCH_THREADS
    resources: **BASELINES.resources("sample_baseline")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline sample_dpdm --in denoiser={input.denoiser:q} --out samples={output.samples:q}"
        " --params {params.p:q} --log {log:q}"


rule sample_dp_ldm:
    """DP-LDM's sampled codes, from its fine-tuned latent denoiser (post-processing: no ledger line)."""
    input:
        denoiser=BASELINES.denoiser_path("{run}"),
    output:
        samples=BASELINES.latent_samples_path("{run}"),
        manifest=BASELINES.latent_manifest_path("{run}"),
    wildcard_constraints:
        run=_baseline_runs.methods_pattern(_baseline_runs.LATENT),
    params:
        p=BASELINES.dpsgd_sample_params,
    log:
        LOGS / "sample_baseline" / "{run}.log",
    benchmark:
        benchmark_path("sample_dp_ldm", "{run}")
    threads: TORCH_THREADS
    resources: **BASELINES.resources("sample_dp_ldm")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline sample_dpdm --in denoiser={input.denoiser:q} --out samples={output.samples:q}"
        " --params {params.p:q} --log {log:q}"


rule dp_ldm_decode:
    """DP-LDM's samples: its sampled codes decoded by the public decoder (post-processing: no ledger line)."""
    input:
        latents=BASELINES.latent_samples_path("{run}"),
        autoencoder=BASELINES.ldm_autoencoder_path,
    output:
        samples=BASELINES.samples_path("{run}"),
        manifest=BASELINES.manifest_path("{run}"),
    wildcard_constraints:
        run=_baseline_runs.methods_pattern(_baseline_runs.LATENT),
    params:
        p=BASELINES.ldm_decode_params,
    log:
        LOGS / "baselines" / "{run}_decode.log",
    benchmark:
        benchmark_path("dp_ldm_decode", "{run}")
    threads: 1
    resources: **BASELINES.resources("dp_ldm_decode")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline dp_ldm_decode --in latents={input.latents:q} autoencoder={input.autoencoder:q}"
        " --out samples={output.samples:q} --params {params.p:q} --log {log:q}"


rule evaluate_baseline:
    """Score one baseline run's samples with the evaluation core (the same call as every method's)."""
    input:
        unpack(EVALUATION.clip_inputs),
        samples=BASELINES.samples_path("{run}"),
        test=DATA / "test.npz",
        evalnet=EVALUATION.evalnet_model,
    output:
        metrics=BASELINES.metrics_path("{run}"),
    wildcard_constraints:
        run=_baseline_runs.RUN_PATTERN,
    params:
        p=BASELINES.evaluate_params,
        clip=EVALUATION.clip_arg,
    log:
        LOGS / "evaluate_baseline" / "{run}.log",
    benchmark:
        benchmark_path("evaluate_baseline", "{run}")
    threads: TORCH_THREADS
    resources: **BASELINES.resources("evaluate_baseline")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline evaluate_samples --in samples={input.samples:q} test={input.test:q}"
        " evalnet={input.evalnet:q}{params.clip} --out metrics={output.metrics:q} --params {params.p:q}"
        " --log {log:q}"


rule baselines_table:
    """The baselines' runs: shared metrics, certified eps recomputed from each transcript (<= target)."""
    input:
        unpack(lambda wildcards: run_table_inputs(BASELINES.records())),
    output:
        table=BASELINES.table,
    params:
        p=lambda wildcards: run_table_params(BASELINES.records()),
        ins=lambda wildcards: io_args("--in", run_table_inputs(BASELINES.records())),
    benchmark:
        benchmark_path("baselines_table")
    log:
        LOGS / "baselines_table.log",
    threads: 1
    resources: **BASELINES.resources("baselines_table")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline baselines_table {params.ins} --out table={output.table:q} --params {params.p:q}"
        " --log {log:q}"
