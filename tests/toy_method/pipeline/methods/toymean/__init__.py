"""A toy method of the plug-in test (tests/test_method_plugin.py): noisy per-class means, drawn as samples.

Shaped like a real method: its declaration (here), its stages (``stage.py``), its wiring (``wiring.py``: paths,
params, targets, transcript, all_runs record, bundle), its cost model (``costs.py``), its random stream
(``streams.py``), its configuration section (``schema.yaml``); beside them its mechanism in the privacy core
(``pipeline/privacy/toymean.py``), its audit hook, its rule file, its caption and its docs page.
"""

from pipeline.plugins import Method

METHOD = Method("toymean", report_category="7 Toy mean", report_prefixes=("toymean",), audited=True,
                title="Toy mean", streams="pipeline.methods.toymean.streams:STREAMS")

STAGES = {
    "toymean_release": "pipeline.methods.toymean.stage:toymean_release",
    "toymean_table": "pipeline.methods.toymean.stage:toymean_table",
}
