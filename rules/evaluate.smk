# Evaluation core: the evaluation network (trained on held-out real data only) and the
# metrics every method's samples are scored with. Code: pipeline/evaluation/. Resources:
# pipeline/resources.py HOUSE_REQUESTS (the evaluation core's costs are the house's: every method's scoring).

from pipeline.methods._evaluation import Wiring as _EvaluationWiring

#: the evaluation core's paths and params (pipeline/methods/_evaluation.py)
EVALUATION = _EvaluationWiring(HOUSE)
# used by rules/dpdm.smk, rules/straightdp.smk
EVALNET = EVALUATION.evalnet
clip_inputs = EVALUATION.clip_inputs
clip_arg = EVALUATION.clip_arg
evaluation_params = EVALUATION.params


rule train_evalnet:
    input:
        train=DATA / "eval_train.npz",
        test=DATA / "test.npz",
    output:
        model=EVALUATION.evalnet_model,
        metrics=EVALUATION.evalnet / "metrics.json",
    params:
        p=EVALUATION.evalnet_params(),
    benchmark:
        benchmark_path("train_evalnet")
    log:
        LOGS / "train_evalnet.log",
    threads: TORCH_THREADS
    resources: **HOUSE.resources("train_evalnet")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline train_evalnet --in train={input.train:q} test={input.test:q}"
        " --out model={output.model:q} metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


if EVALUATION.trains_clip:

    rule train_clip:
        """A small CLIP (open_clip's CLIP and ClipLoss) on the public split only; zero-shot accuracy on real test."""
        input:
            public=DATA / "public.npz",
            test=DATA / "test.npz",
        output:
            model=EVALUATION.clip_model,
            metrics=EVALUATION.clip_dir / "metrics.json",
        params:
            p=EVALUATION.clip_params(),
        benchmark:
            benchmark_path("train_clip")
        log:
            LOGS / "train_clip.log",
        threads: TORCH_THREADS
        resources: **HOUSE.resources("train_clip")
        conda:
            GPU_ENV
        shell:
            "python -m pipeline train_clip --in public={input.public:q} test={input.test:q}"
            " --out model={output.model:q} metrics={output.metrics:q} --params {params.p:q} --log {log:q}"

else:

    rule import_clip:
        """A pretrained open_clip model from evaluation.clip.pretrained_path (never downloaded)."""
        input:
            test=DATA / "test.npz",
        output:
            model=EVALUATION.clip_model,
            metrics=EVALUATION.clip_dir / "metrics.json",
        params:
            p=EVALUATION.clip_params(),
        benchmark:
            benchmark_path("import_clip")
        log:
            LOGS / "import_clip.log",
        threads: 1
        resources: **HOUSE.resources("import_clip")
        conda:
            CPU_ENV
        shell:
            "python -m pipeline import_clip --in test={input.test:q} --out model={output.model:q}"
            " metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule evaluate_reference_real:
    """The 'real data' reference row: held-out real images no model saw, scored like samples."""
    input:
        unpack(EVALUATION.clip_inputs),
        samples=DATA / "reference.npz",
        test=DATA / "test.npz",
        evalnet=EVALUATION.evalnet_model,
    output:
        metrics=EVALUATION.reference_real_metrics,
    params:
        p=EVALUATION.evaluate_params("reference_real"),
        clip=EVALUATION.clip_arg,
    benchmark:
        benchmark_path("evaluate_reference_real")
    log:
        LOGS / "evaluate_reference_real.log",
    threads: TORCH_THREADS
    resources: **HOUSE.resources("evaluate_reference_real")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline evaluate_samples --in samples={input.samples:q} test={input.test:q}"
        " evalnet={input.evalnet:q}{params.clip} --out metrics={output.metrics:q} --params {params.p:q} --log {log:q}"
