"""STRAIGHTDP (Che, Xu & Wu 2026): moment release, rectified flow, THA DP-SGD; its tables and figures.

Its own code is here: the runs and their names (``runs.py``), the stages of the two-stage method
(``stages.py``: the public geometry, pretraining, the moment release, THA DP-SGD, sampling), Fig. 6's toy
(``toy.py``, ``figure6_toy.py``), the tables and figures (``table.py``, ``table2.py``, ``table4.py``), the wiring,
costs, streams, checks, bundle sampler and GPU-check workloads. The rectified flow, its MM-DiT and the training loop
are engines in :mod:`pipeline.flow`. Rules: ``rules/straightdp.smk``.
"""

from pipeline.plugins import Method

METHOD = Method("straightdp", position=6, report_category="5 STRAIGHTDP", report_prefixes=("straightdp",), audited=True,
                title="STRAIGHTDP",
                data_parallel_stages=("train_straightdp",),
                resumable_rules=("pretrain_straightdp", "pretrain_straightdp_arm", "train_straightdp"),
                input_checks="pipeline.methods.straightdp.checks:input_checks",
                streams="pipeline.methods.straightdp.streams:STREAMS",
                bundle_samplers=(("straightdp_flow", "pipeline.methods.straightdp.bundle:sample"),),
                workloads="pipeline.methods.straightdp.workloads:WORKLOADS",
                prepare_config="pipeline.methods.straightdp.checks:prepare_config")

STAGES = {
    # the data stage, for STRAIGHTDP's own public set (its stream straightdp.public: streams.py)
    "prepare_public": "pipeline.methods.straightdp.stages:prepare_public",
    "straightdp_geometry": "pipeline.methods.straightdp.stages:straightdp_geometry",
    "pretrain_straightdp": "pipeline.methods.straightdp.stages:pretrain_straightdp",
    "import_straightdp": "pipeline.flow.public:import_straightdp",
    "release_moments": "pipeline.methods.straightdp.stages:release_moments",
    "train_straightdp": "pipeline.methods.straightdp.stages:train_straightdp",
    "sample_straightdp": "pipeline.methods.straightdp.stages:sample_straightdp",
    "straightdp_table": "pipeline.methods.straightdp.table:straightdp_table",
    "straightdp_figure_accuracy": "pipeline.methods.straightdp.table:straightdp_figure_accuracy",
    "straightdp_figure_horizon": "pipeline.methods.straightdp.table:straightdp_figure_horizon",
    "straightdp_table2": "pipeline.methods.straightdp.table2:straightdp_table2",
    "straightdp_figure6_toy": "pipeline.methods.straightdp.figure6_toy:straightdp_figure6_toy",
    "straightdp_table4_text": "pipeline.methods.straightdp.table4:straightdp_table4_text",
    "train_autoencoder": "pipeline.flow.autoencoder:train_autoencoder",
    "encode_split": "pipeline.flow.autoencoder:encode_split",
}
