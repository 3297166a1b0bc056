# The toy plug-in method (tests/test_method_plugin.py): one release, its evaluation, its table.
from pipeline.registry import RunRecord

TOYMEAN_RUN = "toymean_sigma2_seed0"
TOYMEAN_SAMPLES = EXPDIR / "samples" / "toymean" / f"{TOYMEAN_RUN}.npz"
TOYMEAN_LEDGER = EXPDIR / "ledger" / f"{TOYMEAN_RUN}.jsonl"
TOYMEAN_METRICS = EXPDIR / "eval" / "toymean" / TOYMEAN_RUN / "metrics.json"
TOYMEAN_DELTA = 1e-5
TOYMEAN_RECORDS = [RunRecord(method="toymean", config=TOYMEAN_RUN, seed=0, epsilon_target=None, metrics=TOYMEAN_METRICS,
                             ledgers=(TOYMEAN_LEDGER,), label="toy mean",
                             benchmarks=(benchmark_path("toymean_release"),))]

register_targets("toymean", lambda: [TABLES / "toymean_table.parquet"])
# what the configuration ran: sigma (configured, not calibrated) and the declared N, on its one line
register_transcripts("toymean", lambda: {TOYMEAN_LEDGER: TranscriptSpec(
    claims=1, run=TOYMEAN_RUN, stage="toymean_release", delta=TOYMEAN_DELTA, data=DATA / "private_train.npz",
    params={"extra.toymean_sigma": config["toymean"]["sigma"], "extra.N": PRIVATE["N"]})})
register_runs("toymean", lambda: TOYMEAN_RECORDS)


rule toymean_release:
    input:
        data=DATA / "private_train.npz",
    output:
        samples=TOYMEAN_SAMPLES,
        ledger=TOYMEAN_LEDGER,
    params:
        p=stage_params(sigma=config["toymean"]["sigma"], delta=TOYMEAN_DELTA, seed=0, private=PRIVATE,
                       ledger_binding=ledger_binding(TOYMEAN_RUN)),
    benchmark:
        benchmark_path("toymean_release")
    shell:
        "python -m pipeline toymean_release --in data={input.data:q} --out samples={output.samples:q}"
        " ledger={output.ledger:q} --params {params.p:q}"


rule evaluate_toymean:
    input:
        unpack(clip_inputs),
        samples=TOYMEAN_SAMPLES,
        test=DATA / "test.npz",
        evalnet=EVALNET / "evalnet.pt",
    output:
        metrics=TOYMEAN_METRICS,
    params:
        p=params_json(evaluation=evaluation_params(), seed=SEED, device=config["device"], threads=TORCH_THREADS,
                      name="toymean"),
        clip=clip_arg,
    benchmark:
        benchmark_path("evaluate_toymean")
    shell:
        "python -m pipeline evaluate_samples --in samples={input.samples:q} test={input.test:q}"
        " evalnet={input.evalnet:q}{params.clip} --out metrics={output.metrics:q} --params {params.p:q}"


rule toymean_table:
    input:
        unpack(lambda wildcards: run_table_inputs(TOYMEAN_RECORDS)),
    output:
        table=TABLES / "toymean_table.parquet",
    params:
        p=run_table_params(TOYMEAN_RECORDS),
        ins=io_args("--in", run_table_inputs(TOYMEAN_RECORDS)),
    benchmark:
        benchmark_path("toymean_table")
    shell:
        "python -m pipeline toymean_table {params.ins} --out table={output.table:q} --params {params.p:q}"
