# Audits: the one-run canary audit (Steinke, Nasr & Jagielski 2023) of every ledger line of the chosen
# methods whose mechanism it can rerun: DP-SGD (DPDM's `dpsgd`, STRAIGHTDP's `tha_dpsgd`), STRAIGHTDP's
# moment release, EMPDEN's sampler blocks and the baselines' releases (DP-MERF, PE).
# Code: pipeline/audit/ (stage pipeline.audit.stage:audit_one_run); wiring: pipeline/methods/audit/wiring.py
# (AUDIT, unit-tested in tests/methods/audit/test_wiring.py); each rule's resources: pipeline/methods/audit/costs.py.
# A line whose eps_lb exceeds its claim fails the job. Membership inference (loss + SecMI attacks) on
# every trained model and on DPDM's non-private twin (the positive control): table audit_mia, and
# EMPDEN Table 13's numerical column (pipeline/audit/mia_stage.py).
#
#   snakemake results/tables/audit_one_run.parquet
#   snakemake results/tables/audit_mia.parquet
#   snakemake results/digits/audit/mia/dpdm/edm_eps1_K2_seed0.json     one model's attacks
#   snakemake results/digits/models/dpdm/twin_seed0.pt                 the non-private twin (never release it)

from pipeline.methods.audit.wiring import Wiring as _AuditWiring

#: which transcripts the one-run audit reads (the chosen audited methods' registrations), which models the
#: membership attacks score
AUDIT = _AuditWiring(HOUSE, REGISTRY.transcripts, DPDM, STRAIGHTDP)

register(AUDIT)


rule audit_one_run:
    """One-run canary audit of every auditable ledger line: eps_lb (95%) per line; fails if one exceeds its claim."""
    input:
        unpack(lambda wildcards: AUDIT.audited_transcripts()),
    output:
        table=AUDIT.table,
    params:
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
        p=AUDIT.one_run_params(),
    benchmark:
        benchmark_path("audit_one_run")
    log:
        LOGS / "audit_one_run.log",
    threads: TORCH_THREADS
    resources: **AUDIT.resources("audit_one_run")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline audit_one_run {params.ins} --out table={output.table:q} --params {params.p:q}"
        " --log {log:q}"


rule train_dpdm_twin:
    """DPDM's non-private twin (same recipe, no clip, no noise): the membership attacks' positive control."""
    input:
        unpack(AUDIT.twin_inputs),
    output:
        model=AUDIT.twin_model_path("{seed}"),
        metrics=AUDIT.twin_metrics("{seed}"),
    wildcard_constraints:
        seed="[0-9]+",
    params:
        p=AUDIT.twin_params,
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
    benchmark:
        benchmark_path("train_dpdm_twin", "{seed}")
    log:
        LOGS / "train_dpdm_twin" / "twin_seed{seed}.log",
    threads: TORCH_THREADS
    resources: **AUDIT.resources("train_dpdm_twin")
    retries: cost.segment_retries(config, AUDIT.twin_runtime_min)
    conda:
        GPU_ENV
    shell:
        "python -m pipeline train_dpdm_twin {params.ins} --out model={output.model:q} metrics={output.metrics:q}"
        " --params {params.p:q} --log {log:q}"


rule audit_mia:
    """Membership attacks on one model: loss at audit.mia.loss_sigmas, SecMI at Table 13's stopping points."""
    input:
        model=AUDIT.mia_model_input,
        members=DATA / "private_train.npz",
        nonmembers=AUDIT.nonmembers,
    output:
        metrics=AUDIT.mia_metrics_path("{method}", "{run}"),
    wildcard_constraints:
        method="dpdm|dpdm_twin|straightdp",
    params:
        p=AUDIT.mia_params,
    benchmark:
        benchmark_path("audit_mia", "{method}/{run}")
    log:
        LOGS / "audit_mia" / "{method}_{run}.log",
    threads: TORCH_THREADS
    resources: **AUDIT.resources("audit_mia")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline audit_mia --in model={input.model:q} members={input.members:q}"
        " nonmembers={input.nonmembers:q} --out metrics={output.metrics:q} --params {params.p:q} --log {log:q}"


rule audit_mia_table:
    """Table audit_mia: AUC, TPR at 1% / 0.1% FPR, ASR, eps_refutable per model and attack; fails if an attack
    refutes a claim."""
    input:
        unpack(lambda wildcards: AUDIT.mia_table_inputs()),
    output:
        table=AUDIT.mia_table,
    params:
        ins=lambda wildcards: io_args("--in", AUDIT.mia_table_inputs()),
        p=AUDIT.table_params(),
    benchmark:
        benchmark_path("audit_mia_table")
    log:
        LOGS / "audit_mia_table.log",
    threads: 1
    resources: **AUDIT.resources("audit_mia_table")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline audit_mia_table {params.ins} --out table={output.table:q} --params {params.p:q}"
        " --log {log:q}"


rule empden_table13:
    """EMPDEN Table 13: the theoretical ASR bound beside SecMI's ASR on the non-private twin at the same t."""
    input:
        theoretical=TABLES / "empden_table13_theoretical_asr.parquet",
        twin=AUDIT.table13_twin,
    output:
        table=AUDIT.table13,
    params:
        p=AUDIT.table_params(),
    benchmark:
        benchmark_path("empden_table13")
    log:
        LOGS / "empden_table13.log",
    threads: 1
    resources: **AUDIT.resources("empden_table13")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table13 --in theoretical={input.theoretical:q} twin={input.twin:q}"
        " --out table={output.table:q} --params {params.p:q} --log {log:q}"
