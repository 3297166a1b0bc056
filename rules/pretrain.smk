# The public denoiser: EMPDEN's hybrid sampler finishes with it; DPDM may start from it (dpdm.init).
# Either trained here on the public split only (rule pretrain_public; no private record, no ledger
# line) or the user's own diffusers UNet2DModel folder (pretrain.source: diffusers, rule import_public).
# Code: pipeline/training/pretrain.py (pretrain_public), pipeline/training/loop.py (resumable
# state in results/<exp>/checkpoints/pretrain_public/public_edm/, deliberately not an output,
# so a killed job resumes where its last checkpoint left off); pipeline/training/public.py (import_public).
# Resources: pipeline/resources.py HOUSE_REQUESTS (the public pretraining's costs, which the baselines share).
#
#   snakemake results/digits/models/public_edm.pt      (PUBLIC_DENOISER, rules/common.smk)


if HOUSE.imports_public_denoiser:

    rule import_public:
        """The user's public UNet2DModel (pretrain.path, local files only) in the declared preconditioning."""
        input:
            public=DATA / "public.npz",
        output:
            model=PUBLIC_DENOISER,
            metrics=EXPDIR / "train" / "import_public" / "metrics.json",
        params:
            p=HOUSE.public_denoiser_params(),
        benchmark:
            benchmark_path("import_public")
        log:
            LOGS / "import_public.log",
        threads: 1
        resources: **HOUSE.resources("import_public")
        conda:
            CPU_ENV
        shell:
            "python -m pipeline import_public --in public={input.public:q}"
            " --out model={output.model:q} metrics={output.metrics:q} --params {params.p:q} --log {log:q}"

else:

    rule pretrain_public:
        """The public EDM denoiser (Karras et al. 2022 loss, P_mean -1.2, P_std 1.2), EMA weights."""
        input:
            public=DATA / "public.npz",
        output:
            model=PUBLIC_DENOISER,
            metrics=EXPDIR / "train" / "pretrain_public" / "metrics.json",
        params:
            # functions: a job's micro-batch and GPU memory are counted only for a DAG that runs it
            p=lambda wildcards: stage_params(pretrain=config["pretrain"], seed=SEED, device=config["device"],
                                             threads=TORCH_THREADS, **HOUSE.precision,
                                             **cost.accumulation_params(cost.pretrain_memory(config))),
        benchmark:
            benchmark_path("pretrain_public")
        log:
            LOGS / "pretrain_public.log",
        threads: TORCH_THREADS
        resources: **HOUSE.resources("pretrain_public")
        retries: cost.segment_retries(config, cost.pretrain_runtime_min(config))
        conda:
            GPU_ENV
        shell:
            "python -m pipeline pretrain_public --in public={input.public:q}"
            " --out model={output.model:q} metrics={output.metrics:q} --params {params.p:q} --log {log:q}"
