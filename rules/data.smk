# Data stage: every split written once (uint8 .npz + manifest), deterministic from the seed.
# Code: pipeline/data/stage.py (prepare_data). Resources: pipeline/resources.py HOUSE_REQUESTS.


rule prepare_data:
    output:
        **data_splits(),
        manifests=[p.with_suffix(".json") for p in data_splits().values()],
    params:
        p=params_json(data=config["data"], seed=SEED),
        out=io_args("--out", data_splits()),
    benchmark:
        benchmark_path("prepare_data")
    log:
        LOGS / "prepare_data.log",
    threads: 1
    resources: **HOUSE.resources("prepare_data")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline prepare_data {params.out} --params {params.p:q} --log {log:q}"
