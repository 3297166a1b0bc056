# Public pretraining: the EDM denoiser trained on the public split only (no private record,
# no ledger line). EMPDEN's hybrid sampler finishes with it; DPDM may start from it (dpdm.init).
# Code: pipeline/training/pretrain.py (pretrain_public), pipeline/training/loop.py (resumable
# state in results/<exp>/checkpoints/pretrain_public/public_edm/, deliberately not an output,
# so a killed job resumes where its last checkpoint left off).
#
#   snakemake results/digits/models/public_edm.pt      (PUBLIC_DENOISER, rules/common.smk)


rule pretrain_public:
    """The public EDM denoiser (Karras et al. 2022 loss, P_mean -1.2, P_std 1.2), EMA weights."""
    input:
        public=DATA / "public.npz",
    output:
        model=PUBLIC_DENOISER,
        metrics=EXPDIR / "train" / "pretrain_public" / "metrics.json",
    params:
        p=stage_params(pretrain=config["pretrain"], seed=SEED, device=config["device"],
                      threads=TORCH_THREADS),
    benchmark:
        benchmark_path("pretrain_public")
    log:
        LOGS / "pretrain_public.log",
    threads: TORCH_THREADS
    resources:
        gpu=1,
        mem_mb=cost.pretrain_mem_mb(config),
        runtime=cost.pretrain_runtime_min(config),
    conda:
        GPU_ENV
    shell:
        "python -m pipeline pretrain_public --in public={input.public:q}"
        " --out model={output.model:q} metrics={output.metrics:q} --params {params.p:q} --log {log:q}"
