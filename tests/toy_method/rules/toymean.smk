# The toy plug-in method (tests/test_method_plugin.py): one release, its evaluation, its table.
# Code: pipeline/methods/toymean/ (stages, wiring, costs, streams); its mechanism: pipeline/privacy/toymean.py.

from pipeline.methods.toymean.wiring import Wiring as _ToymeanWiring

TOYMEAN = _ToymeanWiring(HOUSE)

register(TOYMEAN)


rule toymean_release:
    input:
        data=TOYMEAN.data,
    output:
        samples=TOYMEAN.samples,
        ledger=TOYMEAN.ledger,
    params:
        p=TOYMEAN.release_params(),
    benchmark:
        benchmark_path("toymean_release")
    resources: **TOYMEAN.resources("toymean_release")
    shell:
        "python -m pipeline toymean_release --in data={input.data:q} --out samples={output.samples:q}"
        " ledger={output.ledger:q} --params {params.p:q}"


rule evaluate_toymean:
    input:
        unpack(clip_inputs),
        samples=TOYMEAN.samples,
        test=DATA / "test.npz",
        evalnet=EVALNET / "evalnet.pt",
    output:
        metrics=TOYMEAN.metrics,
    params:
        p=params_json(evaluation=evaluation_params(), seed=SEED, device=config["device"], threads=TORCH_THREADS,
                      name="toymean"),
        clip=clip_arg,
    benchmark:
        benchmark_path("evaluate_toymean")
    resources: **TOYMEAN.resources("evaluate_toymean")
    shell:
        "python -m pipeline evaluate_samples --in samples={input.samples:q} test={input.test:q}"
        " evalnet={input.evalnet:q}{params.clip} --out metrics={output.metrics:q} --params {params.p:q}"


rule toymean_table:
    input:
        unpack(lambda wildcards: run_table_inputs(TOYMEAN.records())),
    output:
        table=TOYMEAN.table,
    params:
        p=run_table_params(TOYMEAN.records()),
        ins=io_args("--in", run_table_inputs(TOYMEAN.records())),
    benchmark:
        benchmark_path("toymean_table")
    resources: **TOYMEAN.resources("toymean_table")
    shell:
        "python -m pipeline toymean_table {params.ins} --out table={output.table:q} --params {params.p:q}"
