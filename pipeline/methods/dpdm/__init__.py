"""DPDM (Dockhorn et al. 2023): DP-SGD training with noise multiplicity, its samplers, tables and sample grids, the
task-specific DP-SGD classifier it is compared with, and Fig. 3 (gradient variance vs noise multiplicity K).

Its own code is here: the runs and their names (``runs.py``), the wiring (``wiring.py``), the costs, streams,
checks, bundle sampler and GPU-check workloads, the main sampler's choice on val (``select_sampler.py``), the tables
(``table.py``, ``classifier_table.py``), the task-specific DP-SGD classifier (``dpsgd_classifier.py``) and Fig. 3
(``gradient_variance.py``). Its stages ``train_dpdm``, ``sample_dpdm`` and ``dpdm_sample_grid`` run shared engines,
named for what they do, which the DP-SGD baselines run too: :mod:`pipeline.training.dp_denoiser` (DP-SGD training
of a denoiser), :mod:`pipeline.sampling.samplers` and :mod:`pipeline.sampling.denoiser_stage` (sampling a denoiser
file). Rules: ``rules/dpdm.smk``.
"""

from pipeline.plugins import Method

METHOD = Method("dpdm", position=5, report_category="4 DPDM", report_prefixes=("dpdm",), audited=True,
                title="DPDM",
                data_parallel_stages=("train_dpdm",), resumable_rules=("train_dpdm",),
                streams="pipeline.methods.dpdm.streams:STREAMS",
                bundle_samplers=(("dpdm", "pipeline.methods.dpdm.bundle:sample"),),
                workloads="pipeline.methods.dpdm.workloads:WORKLOADS",
                config_checks="pipeline.methods.dpdm.checks:config_checks")

STAGES = {
    "train_dpdm": "pipeline.training.dp_denoiser:train_dp_denoiser",
    "sample_dpdm": "pipeline.sampling.denoiser_stage:sample_denoiser",
    "dpdm_sample_grid": "pipeline.sampling.denoiser_stage:denoiser_sample_grid",
    "dpdm_select_sampler": "pipeline.methods.dpdm.select_sampler:dpdm_select_sampler",
    "dpdm_table": "pipeline.methods.dpdm.table:dpdm_table",
    "train_dpsgd_classifier": "pipeline.methods.dpdm.dpsgd_classifier:train_dpsgd_classifier",
    "dpdm_classifier_table": "pipeline.methods.dpdm.classifier_table:dpdm_classifier_table",
    "dpdm_gradient_variance": "pipeline.methods.dpdm.gradient_variance:dpdm_gradient_variance",
}
