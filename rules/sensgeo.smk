# SENSGEO: exact sensitivity geometry and optimal noise for the ideal denoiser (analytic, CPU).
# Code: pipeline/methods/sensgeo/tables.py (stages), pipeline/privacy/sensgeo/ (the mathematics).
# No inputs: every public domain K and random covariance is drawn from sensgeo.seed.
# Each rule's resources: pipeline/methods/sensgeo/costs.py (REQUESTS).

from pipeline.methods.sensgeo.wiring import Wiring as _SensgeoWiring

#: SENSGEO's targets and params (pipeline/methods/sensgeo/wiring.py)
SENSGEO = _SensgeoWiring(HOUSE)

register(SENSGEO)


rule sensgeo_fig1_naive_vs_exact:
    """Figure 1 + summary table: naive diameter bound over the exact Mahalanobis diameter."""
    output:
        png=report_figure("sensgeo_fig1_naive_vs_exact"),
        pdf=FIGURES / "sensgeo_fig1_naive_vs_exact.pdf",
        table=TABLES / "sensgeo_fig1_naive_vs_exact.parquet",
    params:
        p=SENSGEO.params("fig1"),
    benchmark:
        benchmark_path("sensgeo_fig1_naive_vs_exact")
    log:
        LOGS / "sensgeo_fig1_naive_vs_exact.log",
    threads: 1
    resources: **SENSGEO.resources("sensgeo_fig1_naive_vs_exact")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline sensgeo_fig1_naive_vs_exact --out figure={output.png:q} table={output.table:q}"
        " --params {params.p:q} --log {log:q}"


rule sensgeo_table_guarantees:
    """Table: exact eps(delta) from rho_* vs generic RDP->DP conversions and the Gaussian PLD."""
    output:
        table=TABLES / "sensgeo_table_guarantees.parquet",
    params:
        p=SENSGEO.params("guarantees"),
    benchmark:
        benchmark_path("sensgeo_table_guarantees")
    log:
        LOGS / "sensgeo_table_guarantees.log",
    threads: 1
    resources: **SENSGEO.resources("sensgeo_table_guarantees")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline sensgeo_table_guarantees --out table={output.table:q} --params {params.p:q} --log {log:q}"


rule sensgeo_table_sdp:
    """Table: covariance SDP primal, dual, certified gap, MSE gain over isotropic noise, solver time."""
    output:
        table=TABLES / "sensgeo_table_sdp.parquet",
    params:
        p=SENSGEO.params("sdp"),
    benchmark:
        benchmark_path("sensgeo_table_sdp")
    log:
        LOGS / "sensgeo_table_sdp.log",
    threads: 1
    resources: **SENSGEO.resources("sensgeo_table_sdp")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline sensgeo_table_sdp --out table={output.table:q} --params {params.p:q} --log {log:q}"


rule sensgeo_fig_mi_snr:
    """Figure: binary-input Gaussian channel capacity vs SNR (MI-DP) and the rho_* calibration."""
    output:
        png=report_figure("sensgeo_fig_mi_snr"),
        pdf=FIGURES / "sensgeo_fig_mi_snr.pdf",
    params:
        p=SENSGEO.params("mi"),
    benchmark:
        benchmark_path("sensgeo_fig_mi_snr")
    log:
        LOGS / "sensgeo_fig_mi_snr.log",
    threads: 1
    resources: **SENSGEO.resources("sensgeo_fig_mi_snr")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline sensgeo_fig_mi_snr --out figure={output.png:q} --params {params.p:q} --log {log:q}"


rule sensgeo_table_bridge:
    """Table: one empirical-denoiser step, SENSGEO's exact rho_* next to EMPDEN's 2C/(beta|D|)."""
    output:
        table=TABLES / "sensgeo_table_bridge.parquet",
    params:
        p=SENSGEO.params("bridge"),
    benchmark:
        benchmark_path("sensgeo_table_bridge")
    log:
        LOGS / "sensgeo_table_bridge.log",
    threads: 1
    resources: **SENSGEO.resources("sensgeo_table_bridge")
    conda:
        CPU_ENV
    shell:
        "python -m pipeline sensgeo_table_bridge --out table={output.table:q} --params {params.p:q} --log {log:q}"
