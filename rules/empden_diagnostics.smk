# EMPDEN proxy diagnostics (Sec. 3.3, 6.3, App. F): is the empirical denoiser on the private
# set a proxy for the public neural denoiser along the sampling trajectory?
# Code: pipeline/methods/empden_diagnostics/proxy.py. They read the private set without DP (as the
# paper's do): descriptive tables, not private releases, so no ledger transcript. Tables 1/4/5/6
# use the sampler's empirical denoiser, normaliser included (EMPDEN.normaliser_input, rules/empden.smk).

from pipeline.methods.empden_diagnostics.wiring import Wiring as _EmpdenDiagnosticsWiring

#: the diagnostics' targets, params and resources (pipeline/methods/empden_diagnostics/wiring.py; their costs:
#: pipeline/methods/empden_diagnostics/costs.py); the normaliser is EMPDEN's (rules/empden.smk)
EMPDEN_DIAGNOSTICS = _EmpdenDiagnosticsWiring(HOUSE, EMPDEN)

register(EMPDEN_DIAGNOSTICS)


rule empden_table4_proxy:
    """EMPDEN Table 4 + Figure 1: cos(x_t - E_hat, x_t - D) and ||E_hat - D||^2 along the trajectory."""
    input:
        unpack(lambda wildcards: EMPDEN.normaliser_input),
        private=DATA / "private_train.npz",
        denoiser=PUBLIC_DENOISER,
    output:
        table=TABLES / "empden_table4_proxy.parquet",
        figure=report_figure("empden_figure1_proxy_cosine"),
    params:
        p=EMPDEN_DIAGNOSTICS.params(),
        norm_in=EMPDEN.normaliser_args,
    benchmark:
        benchmark_path("empden_table4_proxy")
    log:
        LOGS / "empden_table4_proxy.log",
    threads: TORCH_THREADS
    resources: **EMPDEN_DIAGNOSTICS.resources("empden_table4_proxy")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline empden_table4_proxy --in private={input.private:q} denoiser={input.denoiser:q} {params.norm_in}"
        " --out table={output.table:q} figure={output.figure:q} --params {params.p:q} --log {log:q}"


rule empden_table1_window_swap:
    """EMPDEN Tables 1, 5, 6: empirical denoiser swapped into one window vs that window's noise redrawn."""
    input:
        unpack(lambda wildcards: EMPDEN.normaliser_input),
        private=DATA / "private_train.npz",
        denoiser=PUBLIC_DENOISER,
        evalnet=rules.train_evalnet.output.model,
    output:
        table1=TABLES / "empden_table1_window_swap.parquet",
        table5=TABLES / "empden_table5_endpoint_agreement.parquet",
        table6=TABLES / "empden_table6_image_agreement.parquet",
    params:
        p=EMPDEN_DIAGNOSTICS.params(),
        norm_in=EMPDEN.normaliser_args,
    benchmark:
        benchmark_path("empden_table1_window_swap")
    log:
        LOGS / "empden_table1_window_swap.log",
    threads: TORCH_THREADS
    resources: **EMPDEN_DIAGNOSTICS.resources("empden_table1_window_swap")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline empden_table1_window_swap --in private={input.private:q} denoiser={input.denoiser:q}"
        " evalnet={input.evalnet:q} {params.norm_in} --out table1={output.table1:q} table5={output.table5:q} table6={output.table6:q}"
        " --params {params.p:q} --log {log:q}"


rule empden_figure6_critical_window:
    """EMPDEN Figure 6a: the evaluation classifier's probability of the final label along the trajectory."""
    input:
        denoiser=PUBLIC_DENOISER,
        evalnet=rules.train_evalnet.output.model,
    output:
        table=TABLES / "empden_figure6_critical_window.parquet",
        figure=report_figure("empden_figure6_critical_window"),
    params:
        p=EMPDEN_DIAGNOSTICS.params(),
    benchmark:
        benchmark_path("empden_figure6_critical_window")
    log:
        LOGS / "empden_figure6_critical_window.log",
    threads: TORCH_THREADS
    resources: **EMPDEN_DIAGNOSTICS.resources("empden_figure6_critical_window")
    conda:
        GPU_ENV
    shell:
        "python -m pipeline empden_figure6_critical_window --in denoiser={input.denoiser:q} evalnet={input.evalnet:q}"
        " --out table={output.table:q} figure={output.figure:q} --params {params.p:q} --log {log:q}"
