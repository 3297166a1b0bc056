"""STRAIGHTDP (Che, Xu & Wu 2026): moment release, rectified flow, THA DP-SGD; its tables and figures.

Rules: ``rules/straightdp.smk``; runs and their names: ``pipeline/training/straightdp_runs.py``.
"""

from pipeline.plugins import Method

METHOD = Method("straightdp", position=6, report_category="5 STRAIGHTDP", report_prefixes=("straightdp",), audited=True,
                data_parallel_stages=("train_straightdp",),
                resumable_rules=("pretrain_straightdp", "pretrain_straightdp_arm", "train_straightdp"),
                input_checks="pipeline.methods.straightdp.checks:input_checks",
                streams="pipeline.methods.straightdp.streams:STREAMS",
                bundle_samplers=(("straightdp_flow", "pipeline.methods.straightdp.bundle:sample"),),
                workloads="pipeline.methods.straightdp.workloads:WORKLOADS",
                prepare_config="pipeline.methods.straightdp.checks:prepare_config")

STAGES = {
    # the data stage, for STRAIGHTDP's own public set (its stream straightdp.public: streams.py)
    "prepare_public": "pipeline.flow.straightdp:prepare_public",
    "straightdp_geometry": "pipeline.flow.straightdp:straightdp_geometry",
    "pretrain_straightdp": "pipeline.flow.straightdp:pretrain_straightdp",
    "import_straightdp": "pipeline.flow.public:import_straightdp",
    "release_moments": "pipeline.flow.straightdp:release_moments",
    "train_straightdp": "pipeline.flow.straightdp:train_straightdp",
    "sample_straightdp": "pipeline.flow.straightdp:sample_straightdp",
    "straightdp_table": "pipeline.results.straightdp:straightdp_table",
    "straightdp_figure_accuracy": "pipeline.results.straightdp:straightdp_figure_accuracy",
    "straightdp_figure_horizon": "pipeline.results.straightdp:straightdp_figure_horizon",
    "straightdp_table2": "pipeline.results.straightdp_table2:straightdp_table2",
    "straightdp_figure6_toy": "pipeline.results.straightdp_toy:straightdp_figure6_toy",
    "straightdp_table4_text": "pipeline.results.straightdp_table4:straightdp_table4_text",
    "train_autoencoder": "pipeline.flow.autoencoder:train_autoencoder",
    "encode_split": "pipeline.flow.autoencoder:encode_split",
}
