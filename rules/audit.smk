# Audits: the one-run canary audit (Steinke, Nasr & Jagielski 2023) of every ledger line of the chosen
# methods whose mechanism it can rerun: DP-SGD (DPDM's `dpsgd`, STRAIGHTDP's `tha_dpsgd`), STRAIGHTDP's
# moment release, EMPDEN's sampler blocks and the baselines' releases (DP-MERF, PE).
# Code: pipeline/audit/ (stage pipeline.audit.stage:audit_one_run); wiring: rules/functions/audit.smk.
# A line whose eps_lb exceeds its claim fails the job. Membership inference (loss + SecMI attacks) on
# every trained model and on DPDM's non-private twin (the positive control): table audit_mia, and
# EMPDEN Table 13's numerical column (pipeline/audit/mia_stage.py).
#
#   snakemake results/tables/audit_one_run.parquet
#   snakemake results/tables/audit_mia.parquet
#   snakemake results/digits/audit/mia/dpdm/edm_eps1_K2_seed0.json     one model's attacks
#   snakemake results/digits/models/dpdm/twin_seed0.pt                 the non-private twin (never release it)

include: "functions/audit.smk"

register_targets("audit", lambda: [AUDIT_TABLE] + mia_targets())


rule audit_one_run:
    """One-run canary audit of every auditable ledger line: eps_lb (95%) per line; fails if one exceeds its claim."""
    input:
        unpack(lambda wildcards: _audited_transcripts()),
    output:
        table=AUDIT_TABLE,
    params:
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
        p=stage_params(audit=config["audit"], seed=SEED, threads=TORCH_THREADS),
    benchmark:
        benchmark_path("audit_one_run")
    log:
        LOGS / "audit_one_run.log",
    threads: TORCH_THREADS
    resources:
        mem_mb=2000,
        runtime=lambda wildcards: cost.audit_runtime_min(config, sum(s.claims for s in _audited_claims().values()),
                                                         sum(s.claims for s in _empden_claims().values())),
    conda:
        CPU_ENV
    shell:
        "python -m pipeline audit_one_run {params.ins} --out table={output.table:q} --params {params.p:q}"
        " --log {log:q}"


rule train_dpdm_twin:
    """DPDM's non-private twin (same recipe, no clip, no noise): the membership attacks' positive control."""
    input:
        unpack(twin_inputs),
    output:
        model=twin_model_path("{seed}"),
        metrics=EXPDIR / "train" / "dpdm_twin" / "twin_seed{seed}.json",
    wildcard_constraints:
        seed="[0-9]+",
    params:
        p=twin_params,
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
    benchmark:
        benchmark_path("train_dpdm_twin", "{seed}")
    log:
        LOGS / "train_dpdm_twin" / "twin_seed{seed}.log",
    threads: TORCH_THREADS
    resources:
        gpu=1,
        mem_mb=4000,
        runtime=lambda wildcards: cost.dpdm_twin_runtime_min(config),
    conda:
        GPU_ENV
    shell:
        "python -m pipeline train_dpdm_twin {params.ins} --out model={output.model:q} metrics={output.metrics:q}"
        " --params {params.p:q} --log {log:q}"


rule audit_mia:
    """Membership attacks on one model: loss at audit.mia.loss_sigmas, SecMI at Table 13's stopping points."""
    input:
        model=mia_model_input,
        members=DATA / "private_train.npz",
        nonmembers=DATA / f"{MIA_NONMEMBERS}.npz",
    output:
        metrics=mia_metrics_path("{method}", "{run}"),
    wildcard_constraints:
        method="dpdm|dpdm_twin|straightdp",
    params:
        p=lambda wildcards: stage_params(mia=mia_attack_settings(), grid=mia_grid(), method=wildcards.method,
                                         run=wildcards.run, nonmember_split=MIA_NONMEMBERS, seed=SEED,
                                         delta=mia_refute_delta(), device=config["device"],
                                         threads=TORCH_THREADS),
    benchmark:
        benchmark_path("audit_mia", "{method}/{run}")
    log:
        LOGS / "audit_mia" / "{method}_{run}.log",
    threads: TORCH_THREADS
    resources:
        gpu=1,
        mem_mb=3000,
        runtime=lambda wildcards: cost.mia_runtime_min(config),
    conda:
        GPU_ENV
    shell:
        "python -m pipeline audit_mia --in model={input.model:q} members={input.members:q}"
        " nonmembers={input.nonmembers:q} --out metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule audit_mia_table:
    """Table audit_mia: AUC, TPR at 1% / 0.1% FPR, ASR, eps_refutable per model and attack; fails if an attack
    refutes a claim."""
    input:
        unpack(lambda wildcards: mia_table_inputs()),
    output:
        table=MIA_TABLE,
    params:
        ins=lambda wildcards: io_args("--in", mia_table_inputs()),
        p=stage_params(seed=SEED),
    benchmark:
        benchmark_path("audit_mia_table")
    log:
        LOGS / "audit_mia_table.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline audit_mia_table {params.ins} --out table={output.table:q} --params {params.p:q}"
        " --log {log:q}"


rule empden_table13:
    """EMPDEN Table 13: the theoretical ASR bound beside SecMI's ASR on the non-private twin at the same t."""
    input:
        theoretical=TABLES / "empden_table13_theoretical_asr.parquet",
        twin=mia_metrics_path("dpdm_twin", f"twin_seed{config['dpdm']['seeds'][0]}"),
    output:
        table=TABLE13,
    params:
        p=stage_params(seed=SEED),
    benchmark:
        benchmark_path("empden_table13")
    log:
        LOGS / "empden_table13.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table13 --in theoretical={input.theoretical:q} twin={input.twin:q}"
        " --out table={output.table:q} --params {params.p:q} --log {log:q}"
