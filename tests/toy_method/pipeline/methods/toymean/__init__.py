"""A toy method of the plug-in test (tests/test_method_plugin.py): noisy per-class means, drawn as samples."""

from pipeline.plugins import Method

METHOD = Method("toymean", report_category="7 Toy mean", report_prefixes=("toymean",), audited=True)

STAGES = {
    "toymean_release": "pipeline.methods.toymean.stage:toymean_release",
    "toymean_table": "pipeline.methods.toymean.stage:toymean_table",
}
