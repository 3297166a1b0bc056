# Public pretraining: the EDM denoiser trained on the public split only (no private record,
# no ledger line). EMPDEN's hybrid sampler finishes with it; DPDM may start from it (dpdm.init).
# Code: pipeline/training/pretrain.py (pretrain_public), pipeline/training/loop.py (resumable
# state in results/<exp>/checkpoints/pretrain_public/public_edm/, deliberately not an output,
# so a killed job resumes where its last checkpoint left off).
#
#   snakemake results/digits/models/public_edm.pt

PUBLIC_EDM = EXPDIR / "models" / "public_edm.pt"

# SLURM runtime: the embedded default (<= 16x16) runs on one CPU core at ~0.3 s per step of
# 64 images (x4 headroom for a shared machine); paper presets run on one GPU, where EDM's
# DDPM++ costs ~4e-4 GPU-s per 32x32 image (Karras et al. 2022 App. F: 200 Mimg in ~2 days
# on 8 V100s), x1.5 headroom.
_PRETRAIN = config["pretrain"]
_PRETRAIN_IMAGES = _PRETRAIN["steps"] * _PRETRAIN["batch_size"]
_SIDE = config["data"]["image_size"]
PRETRAIN_RUNTIME_MIN = 10 + int(
    4 * _PRETRAIN_IMAGES / 64 * 0.3 / 60 if _SIDE <= 16 else 1.5 * _PRETRAIN_IMAGES * (_SIDE / 32) ** 2 * 4e-4 / 60)


rule pretrain_public:
    """The public EDM denoiser (Karras et al. 2022 loss, P_mean -1.2, P_std 1.2), EMA weights."""
    input:
        public=DATA / "public.npz",
    output:
        model=PUBLIC_EDM,
        metrics=EXPDIR / "train" / "pretrain_public" / "metrics.json",
    params:
        p=stage_params(pretrain=config["pretrain"], seed=SEED, device=config["device"],
                      threads=torch_threads()),
    log:
        LOGS / "pretrain_public.log",
    threads: torch_threads()
    resources:
        gpu=1,
        mem_mb=4000 if _SIDE <= 16 else 16000,
        runtime=PRETRAIN_RUNTIME_MIN,
    conda:
        GPU_ENV
    shell:
        "python -m pipeline pretrain_public --in public={input.public:q}"
        " --out model={output.model:q} metrics={output.metrics:q} --params {params.p:q} --log {log:q}"
