"""Certified bundles: a private run's weights or synthetic set, with the ledger transcripts that certify it.

:mod:`pipeline.bundles.bundle` (export stage, layout, verification), :mod:`pipeline.bundles.weights` (safetensors
in diffusers' layout), :mod:`pipeline.bundles.card` (the Hugging Face model card), :mod:`pipeline.bundles.sample`
(sampling a bundle offline), :mod:`pipeline.bundles.cli` (``verify_bundle``, ``sample_bundle``).
"""
