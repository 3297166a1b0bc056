"""SENSGEO: exact sensitivity geometry and optimal noise for the ideal denoiser (analytic, CPU).

Its stages: ``tables.py``. Rules: ``rules/sensgeo.smk``. The mathematics: ``pipeline/privacy/sensgeo/``.
"""

from pipeline.plugins import Method

METHOD = Method("sensgeo", position=2, report_category="6 SENSGEO", report_prefixes=("sensgeo",),
                title="SENSGEO",
                streams="pipeline.methods.sensgeo.streams:STREAMS")

STAGES = {
    "sensgeo_fig1_naive_vs_exact": "pipeline.methods.sensgeo.tables:sensgeo_fig1_naive_vs_exact",
    "sensgeo_table_guarantees": "pipeline.methods.sensgeo.tables:sensgeo_table_guarantees",
    "sensgeo_table_sdp": "pipeline.methods.sensgeo.tables:sensgeo_table_sdp",
    "sensgeo_fig_mi_snr": "pipeline.methods.sensgeo.tables:sensgeo_fig_mi_snr",
    "sensgeo_table_bridge": "pipeline.methods.sensgeo.tables:sensgeo_table_bridge",
}
