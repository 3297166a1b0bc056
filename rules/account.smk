# Accounting: EMPDEN's sampling-time accounting tables and figures (method `accounting`: CPU
# only, exact or numerical accountants, no data) and the ledger replay of every chosen method.
# Code: pipeline/results/empden_accounting{,_figures}.py, pipeline/privacy/replay.py; numbers from pipeline/privacy/.
#
# `empden_blocks` accounts every private block once (the expensive part) and writes its
# claims to the ledger; the table rules only select columns from its JSON.
# Each rule's resources: its request in pipeline/methods/accounting/costs.py (REQUESTS).

from pipeline.methods.accounting.wiring import Wiring as _AccountingWiring

#: the accounting tables' paths and params (pipeline/methods/accounting/wiring.py); a chosen method that needs the
#: private set size n without one is a one-line error now, not mid-DAG
try:
    ACCOUNTING = _AccountingWiring(HOUSE)
except ConfigError as _exc:
    raise WorkflowError(str(_exc)) from None

register(ACCOUNTING)
# one claim per accounted block: configuration claims, which read no private data


rule empden_blocks:
    """Every EMPDEN private block: mu_bar_B, q_B, eps from PLD/Edgeworth/CLT/RDP; ledger claims."""
    output:
        blocks=ACCOUNTING.blocks,
        ledger=ACCOUNTING.ledger,
    params:
        p=ACCOUNTING.blocks_params(),
    benchmark:
        benchmark_path("empden_blocks")
    log:
        LOGS / "empden_blocks.log",
    threads: 1
    resources: **ACCOUNTING.resources("empden_blocks")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_blocks --out blocks={output.blocks:q} ledger={output.ledger:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_table7_accountants:
    """EMPDEN Table 7: Edgeworth, PLD lower (estimate), PLD upper (certified), RDP per block."""
    input:
        blocks=ACCOUNTING.blocks,
    output:
        table=TABLES / "empden_table7_accountants.parquet",
    benchmark:
        benchmark_path("empden_table7_accountants")
    log:
        LOGS / "empden_table7_accountants.log",
    threads: 1
    resources: **ACCOUNTING.resources("empden_table7_accountants")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table7_accountants --in blocks={input.blocks:q}"
        " --out table={output.table:q} --log {log:q}"


rule empden_table8_9_eps:
    """EMPDEN Tables 8/9, eps columns over the p x B grid (T is post-processing)."""
    input:
        blocks=ACCOUNTING.blocks,
    output:
        table=TABLES / "empden_table8_9_eps.parquet",
    benchmark:
        benchmark_path("empden_table8_9_eps")
    log:
        LOGS / "empden_table8_9_eps.log",
    threads: 1
    resources: **ACCOUNTING.resources("empden_table8_9_eps")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table8_9_eps --in blocks={input.blocks:q}"
        " --out table={output.table:q} --log {log:q}"


rule empden_table11_edgeworth_clt_pld:
    """EMPDEN Table 11: Edgeworth and CLT estimates against the certified PLD upper bound."""
    input:
        blocks=ACCOUNTING.blocks,
    output:
        table=TABLES / "empden_table11_edgeworth_clt_pld.parquet",
    benchmark:
        benchmark_path("empden_table11_edgeworth_clt_pld")
    log:
        LOGS / "empden_table11_edgeworth_clt_pld.log",
    threads: 1
    resources: **ACCOUNTING.resources("empden_table11_edgeworth_clt_pld")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_table11_edgeworth_clt_pld --in blocks={input.blocks:q}"
        " --out table={output.table:q} --log {log:q}"


rule empden_table12_rdp:
    """EMPDEN Table 12: certified RDP eps at delta and at delta = 1/n^2."""
    input:
        blocks=ACCOUNTING.blocks,
    output:
        table=TABLES / "empden_table12_rdp.parquet",
    benchmark:
        benchmark_path("empden_table12_rdp")
    log:
        LOGS / "empden_table12_rdp.log",
    threads: 1
    resources: **ACCOUNTING.resources("empden_table12_rdp")
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
        p=ACCOUNTING.params(),
    benchmark:
        benchmark_path("empden_table13_theoretical_asr")
    log:
        LOGS / "empden_table13_theoretical_asr.log",
    threads: 1
    resources: **ACCOUNTING.resources("empden_table13_theoretical_asr")
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
        p=ACCOUNTING.params(),
    benchmark:
        benchmark_path("empden_figure4_full_batch")
    log:
        LOGS / "empden_figure4_full_batch.log",
    threads: 1
    resources: **ACCOUNTING.resources("empden_figure4_full_batch")
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
        p=ACCOUNTING.params(),
    benchmark:
        benchmark_path("empden_figure5_mu_vs_logsnr")
    log:
        LOGS / "empden_figure5_mu_vs_logsnr.log",
    threads: 1
    resources: **ACCOUNTING.resources("empden_figure5_mu_vs_logsnr")
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
        p=ACCOUNTING.params(),
    benchmark:
        benchmark_path("empden_figure7_stopping_traces")
    log:
        LOGS / "empden_figure7_stopping_traces.log",
    threads: 1
    resources: **ACCOUNTING.resources("empden_figure7_stopping_traces")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline empden_figure7_stopping_traces --out figure={output.png:q} --params {params.p:q} --log {log:q}"


rule replay:
    """Recompute every ledger claim from the transcripts alone; fail on an uncovered eps, an event its
    line's parameters do not rebuild, a transcript that is missing, empty, cut off or short, or a line not
    bound to the run, stage, delta and private split its method registered."""
    input:
        unpack(lambda wildcards: ACCOUNTING.replay_inputs(OUTPUTS.ledger_transcripts())),
    output:
        report=REPLAY_REPORT,
    params:
        ins=lambda wildcards, input: io_args("--in", dict(input.items())),
        # what each private stage writes, as its method registered it (pipeline/registry.py TranscriptSpec)
        p=lambda wildcards: ACCOUNTING.replay_params(OUTPUTS.ledger_claims()),
    benchmark:
        benchmark_path("replay")
    log:
        LOGS / "replay.log",
    threads: 1
    resources: **ACCOUNTING.resources("replay")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline replay {params.ins} --out report={output.report:q}"
        " --params {params.p:q} --log {log:q}"
