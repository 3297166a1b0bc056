"""Baselines (DP-MERF and its successors DP-HP, DP-NTK, DP-MEPF; Private Evolution; DP-Diffusion, PrivImage,
DP-LDM) under the same protocol, their table; and the cross-method comparison (all_runs.parquet, the privacy-utility figure).

Rules: ``rules/baselines.smk`` and ``rules/report.smk`` (all_runs); runs and their names:
``pipeline/baselines/runs.py``.
"""

from pipeline.plugins import Method

METHOD = Method("baselines", position=7, report_category="7 Baselines", report_prefixes=("baselines",), audited=True,
                title="Baselines (DP-MERF, PE, DP-SGD fine-tuning)",
                resumable_rules=("privimage_pretrain", "dp_ldm_pretrain"),
                streams="pipeline.methods.baselines.streams:STREAMS",
                bundle_samplers=(("dp_merf", "pipeline.methods.baselines.bundle:sample"),),
                bundle_exports=((".safetensors", "pipeline.methods.baselines.bundle:export_generator"),),
                config_checks="pipeline.methods.baselines.checks:config_checks")

STAGES = {
    "dp_merf": "pipeline.baselines.dp_merf:dp_merf",
    "private_evolution": "pipeline.baselines.private_evolution:private_evolution",
    "dp_hp": "pipeline.baselines.embedding_family:dp_hp",
    "dp_ntk": "pipeline.baselines.embedding_family:dp_ntk",
    "dp_mepf": "pipeline.baselines.embedding_family:dp_mepf",
    "privimage_query_net": "pipeline.baselines.privimage:privimage_query_net",
    "privimage_select": "pipeline.baselines.privimage:privimage_select",
    "dp_ldm_decode": "pipeline.baselines.dp_ldm:dp_ldm_decode",
    "baselines_table": "pipeline.results.baselines:baselines_table",
}
