"""DPDM (Dockhorn et al. 2023): DP-SGD training with noise multiplicity, its samplers, tables and sample grids, the
task-specific DP-SGD classifier it is compared with, and Fig. 3 (gradient variance vs noise multiplicity K).

Rules: ``rules/dpdm.smk``; runs and their names: ``pipeline/training/dpdm_runs.py``.
"""

from pipeline.plugins import Method

METHOD = Method("dpdm", position=5, report_category="4 DPDM", report_prefixes=("dpdm",), audited=True,
                data_parallel_stages=("train_dpdm",), resumable_rules=("train_dpdm",),
                streams="pipeline.methods.dpdm.streams:STREAMS",
                bundle_samplers=(("dpdm", "pipeline.methods.dpdm.bundle:sample"),),
                workloads="pipeline.methods.dpdm.workloads:WORKLOADS",
                config_checks="pipeline.methods.dpdm.checks:config_checks")

STAGES = {
    "train_dpdm": "pipeline.training.dpdm:train_dpdm",
    "sample_dpdm": "pipeline.sampling.dpdm_stage:sample_dpdm",
    "dpdm_sample_grid": "pipeline.sampling.dpdm_stage:dpdm_sample_grid",
    "dpdm_select_sampler": "pipeline.sampling.dpdm_select:dpdm_select_sampler",
    "dpdm_table": "pipeline.results.dpdm:dpdm_table",
    "train_dpsgd_classifier": "pipeline.training.dpsgd_classifier:train_dpsgd_classifier",
    "dpdm_classifier_table": "pipeline.results.dpdm_classifier:dpdm_classifier_table",
    "dpdm_gradient_variance": "pipeline.diagnostics.gradient_variance:dpdm_gradient_variance",
}
