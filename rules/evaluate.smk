# Evaluation core: the evaluation network (trained on held-out real data only) and the
# metrics every method's samples are scored with. Code: pipeline/evaluation/.

EVALNET = EXPDIR / "evalnet"


rule train_evalnet:
    input:
        train=DATA / "eval_train.npz",
        test=DATA / "test.npz",
    output:
        model=EVALNET / "evalnet.pt",
        metrics=EVALNET / "metrics.json",
    params:
        p=params_json(evalnet=config["evaluation"]["evalnet"], seed=SEED, device=config["device"]),
    log:
        LOGS / "train_evalnet.log",
    threads: TORCH_THREADS
    resources:
        gpu=1,
        mem_mb=4000,
        runtime=cost.evalnet_runtime_min(config),
    conda:
        GPU_ENV
    shell:
        "python -m pipeline train_evalnet --in train={input.train:q} test={input.test:q}"
        " --out model={output.model:q} metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule evaluate_reference_real:
    """The 'real data' reference row: held-out real images no model saw, scored like samples."""
    input:
        samples=DATA / "reference.npz",
        test=DATA / "test.npz",
        evalnet=EVALNET / "evalnet.pt",
    output:
        metrics=EXPDIR / "eval" / "reference_real" / "metrics.json",
    params:
        p=params_json(evaluation=config["evaluation"], seed=SEED, device=config["device"], name="reference_real"),
    log:
        LOGS / "evaluate_reference_real.log",
    threads: TORCH_THREADS
    resources:
        gpu=1,
        mem_mb=6000,
        runtime=cost.evaluation_runtime_min(config),
    conda:
        GPU_ENV
    shell:
        "python -m pipeline evaluate_samples --in samples={input.samples:q} test={input.test:q}"
        " evalnet={input.evalnet:q} --out metrics={output.metrics:q} --params {params.p:q} --log {log:q}"
