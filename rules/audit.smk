# Audits: the one-run canary audit (Steinke, Nasr & Jagielski 2023) of every DP-SGD ledger line of
# the chosen methods that train with the DP-SGD engine (DPDM's `dpsgd`, STRAIGHTDP's `tha_dpsgd`).
# Code: pipeline/audit/ (stage pipeline.audit.stage:audit_one_run); wiring: rules/functions/audit.smk.
# A line whose eps_lb exceeds its claim fails the job.
#
#   snakemake results/tables/audit_one_run.parquet

include: "functions/audit.smk"

register_targets("audit", lambda: [AUDIT_TABLE])


rule audit_one_run:
    """One-run canary audit of every DP-SGD line: eps_lb (95%) per run; fails if one exceeds its certified eps."""
    input:
        unpack(lambda wildcards: _audited_transcripts()),
    output:
        table=AUDIT_TABLE,
    params:
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
        p=stage_params(audit=config["audit"], seed=SEED, threads=TORCH_THREADS),
    log:
        LOGS / "audit_one_run.log",
    threads: TORCH_THREADS
    resources:
        mem_mb=2000,
        runtime=lambda wildcards: cost.audit_runtime_min(config, sum(_audited_claims().values())),
    conda:
        CPU_ENV
    shell:
        "python -m pipeline audit_one_run {params.ins} --out table={output.table:q} --params {params.p:q}"
        " --log {log:q}"
