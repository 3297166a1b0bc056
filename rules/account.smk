# Accounting: EMPDEN's sampling-time accounting tables and figures (method `accounting`: CPU
# only, exact or numerical accountants, no data) and the ledger replay of every chosen method.
# Code: pipeline/results/empden_accounting{,_figures}.py, pipeline/privacy/replay.py; numbers from pipeline/privacy/.
#
# `empden_blocks` accounts every private block once (the expensive part) and writes its
# claims to the ledger; the table rules only select columns from its JSON.

#: accounting keys that only list the accounting tables' grids; the EMPDEN mechanism itself
#: (schedule, C, beta, delta, PLD settings) is the rest, and only that reaches the samplers
ACCOUNTING_GRID_KEYS = ("p", "B", "mu_bar_B", "sigma_min_sweep", "asr_q", "asr_N", "rdp_orders", "N_out")


#: what a sampled cell's eps columns read (rule empden_table8_grid): delta, the PLD grid, RDP orders
ACCOUNTING_EPS_KEYS = ("delta", "discretisation", "log_mass_truncation", "rdp_orders")
#: the `accounting` section without its table grids: what an EMPDEN cell's noise and claim depend on
ACCOUNTING_MECHANISM = {k: v for k, v in config["accounting"].items() if k not in ACCOUNTING_GRID_KEYS}


#: private set size n of the accounting: accounting.n, else data.private.n_private_train
ACCOUNTING_N = config["accounting"]["n"] or config["data"]["private"]["n_private_train"]
_NEEDS_N = any(method_on(m) for m in ("accounting", "empden", "empden_diagnostics"))
if ACCOUNTING_N is None and _NEEDS_N:
    raise WorkflowError("config error at accounting.n: set it when data.private.n_private_train is null")
ACCOUNTING_PARAMS = stage_params(accounting=config["accounting"], n=ACCOUNTING_N, seed=SEED)

_N_BLOCKS = len(config["accounting"]["p"]) * len(config["accounting"]["B"]) + len(config["accounting"]["mu_bar_B"] or [])
ACCOUNTING_RUNTIME_MIN = cost.accounting_runtime_min(config, _N_BLOCKS)
ACCOUNTING_MEM_MB = cost.accounting_mem_mb(config)

EMPDEN_BLOCKS = EXPDIR / "accounting" / "empden_blocks.json"
EMPDEN_LEDGER = EXPDIR / "ledger" / "empden_blocks.jsonl"
EMPDEN_OUTPUTS = [
    TABLES / "empden_table7_accountants.parquet",
    TABLES / "empden_table8_9_eps.parquet",
    TABLES / "empden_table11_edgeworth_clt_pld.parquet",
    TABLES / "empden_table12_rdp.parquet",
    TABLES / "empden_table13_theoretical_asr.parquet",
    FIGURES / "empden_figure4_full_batch.png",
    FIGURES / "empden_figure5_mu_vs_logsnr.png",
    FIGURES / "empden_figure7_stopping_traces.png",
]

register_targets("accounting", lambda: EMPDEN_OUTPUTS)
# one claim per accounted block: configuration claims, which read no private data
register_transcripts("accounting", lambda: {EMPDEN_LEDGER: TranscriptSpec(
    claims=_N_BLOCKS, run="empden_blocks", stage="empden_blocks", delta=config["accounting"]["delta"],
    configuration=True)})


rule empden_blocks:
    """Every EMPDEN private block: mu_bar_B, q_B, eps from PLD/Edgeworth/CLT/RDP; ledger claims."""
    output:
        blocks=EMPDEN_BLOCKS,
        ledger=EMPDEN_LEDGER,
    params:
        p=stage_params(accounting=config["accounting"], n=ACCOUNTING_N, seed=SEED,
                       ledger_binding=ledger_binding("empden_blocks")),
    benchmark:
        benchmark_path("empden_blocks")
    log:
        LOGS / "empden_blocks.log",
    threads: 1
    resources:
        mem_mb=ACCOUNTING_MEM_MB,
        runtime=ACCOUNTING_RUNTIME_MIN,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_blocks --out blocks={output.blocks:q} ledger={output.ledger:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_table7_accountants:
    """EMPDEN Table 7: Edgeworth, PLD lower (estimate), PLD upper (certified), RDP per block."""
    input:
        blocks=EMPDEN_BLOCKS,
    output:
        table=TABLES / "empden_table7_accountants.parquet",
    benchmark:
        benchmark_path("empden_table7_accountants")
    log:
        LOGS / "empden_table7_accountants.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table7_accountants --in blocks={input.blocks:q}"
        " --out table={output.table:q} --log {log:q}"


rule empden_table8_9_eps:
    """EMPDEN Tables 8/9, eps columns over the p x B grid (T is post-processing)."""
    input:
        blocks=EMPDEN_BLOCKS,
    output:
        table=TABLES / "empden_table8_9_eps.parquet",
    benchmark:
        benchmark_path("empden_table8_9_eps")
    log:
        LOGS / "empden_table8_9_eps.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table8_9_eps --in blocks={input.blocks:q}"
        " --out table={output.table:q} --log {log:q}"


rule empden_table11_edgeworth_clt_pld:
    """EMPDEN Table 11: Edgeworth and CLT estimates against the certified PLD upper bound."""
    input:
        blocks=EMPDEN_BLOCKS,
    output:
        table=TABLES / "empden_table11_edgeworth_clt_pld.parquet",
    benchmark:
        benchmark_path("empden_table11_edgeworth_clt_pld")
    log:
        LOGS / "empden_table11_edgeworth_clt_pld.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table11_edgeworth_clt_pld --in blocks={input.blocks:q}"
        " --out table={output.table:q} --log {log:q}"


rule empden_table12_rdp:
    """EMPDEN Table 12: certified RDP eps at delta and at delta = 1/n^2."""
    input:
        blocks=EMPDEN_BLOCKS,
    output:
        table=TABLES / "empden_table12_rdp.parquet",
    benchmark:
        benchmark_path("empden_table12_rdp")
    log:
        LOGS / "empden_table12_rdp.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table12_rdp --in blocks={input.blocks:q}"
        " --out table={output.table:q} --log {log:q}"


rule empden_table13_theoretical_asr:
    """EMPDEN Table 13, theoretical rows: ASR bound from eps_u per q and stopping point."""
    output:
        table=TABLES / "empden_table13_theoretical_asr.parquet",
    params:
        p=ACCOUNTING_PARAMS,
    benchmark:
        benchmark_path("empden_table13_theoretical_asr")
    log:
        LOGS / "empden_table13_theoretical_asr.log",
    threads: 1
    resources:
        mem_mb=ACCOUNTING_MEM_MB,
        runtime=ACCOUNTING_RUNTIME_MIN,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table13_theoretical_asr --out table={output.table:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_figure4_full_batch:
    """EMPDEN Figure 4 left/middle: full-batch delta(eps) and trade-off curves over sigma_min."""
    output:
        png=report_figure("empden_figure4_full_batch"),
        pdf=FIGURES / "empden_figure4_full_batch.pdf",
    params:
        p=ACCOUNTING_PARAMS,
    benchmark:
        benchmark_path("empden_figure4_full_batch")
    log:
        LOGS / "empden_figure4_full_batch.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_figure4_full_batch --out figure={output.png:q} --params {params.p:q} --log {log:q}"


rule empden_figure5_mu_vs_logsnr:
    """EMPDEN Figure 5: per-step mu_t against log SNR (full batch)."""
    output:
        png=report_figure("empden_figure5_mu_vs_logsnr"),
        pdf=FIGURES / "empden_figure5_mu_vs_logsnr.pdf",
    params:
        p=ACCOUNTING_PARAMS,
    benchmark:
        benchmark_path("empden_figure5_mu_vs_logsnr")
    log:
        LOGS / "empden_figure5_mu_vs_logsnr.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_figure5_mu_vs_logsnr --out figure={output.png:q} --params {params.p:q} --log {log:q}"


rule empden_figure7_stopping_traces:
    """EMPDEN Figure 7: eps(delta) traces and trade-off curves per stopping time."""
    output:
        png=report_figure("empden_figure7_stopping_traces"),
        pdf=FIGURES / "empden_figure7_stopping_traces.pdf",
    params:
        p=ACCOUNTING_PARAMS,
    benchmark:
        benchmark_path("empden_figure7_stopping_traces")
    log:
        LOGS / "empden_figure7_stopping_traces.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_figure7_stopping_traces --out figure={output.png:q} --params {params.p:q} --log {log:q}"


rule replay:
    """Recompute every ledger claim from the transcripts alone; fail on an uncovered eps, an event its
    line's parameters do not rebuild, a transcript that is missing, empty, cut off or short, or a line not
    bound to the run, stage, delta and private split its method registered."""
    input:
        unpack(lambda wildcards: {Path(p).stem: p for p in ledger_transcripts()}),
    output:
        report=REPLAY_REPORT,
    params:
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
        # what each private stage writes, as its method registered it (pipeline/registry.py TranscriptSpec)
        p=lambda wildcards: stage_params(expected={Path(t).stem: spec.as_dict() for t, spec in ledger_claims().items()},
                                         experiment=EXP),
    benchmark:
        benchmark_path("replay")
    log:
        LOGS / "replay.log",
    threads: 1
    resources:
        mem_mb=ACCOUNTING_MEM_MB,
        runtime=ACCOUNTING_RUNTIME_MIN,
    conda:
        CPU_ENV
    shell:
        "python -m pipeline replay {params.ins} --out report={output.report:q}"
        " --params {params.p:q} --log {log:q}"
