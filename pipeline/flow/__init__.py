"""STRAIGHTDP's rectified flow: the path and its sampler, the analytic field of Prop. 3.1, the MM-DiT, training.

Neutral ground for the method's stages: nothing here reads private data or imports
:mod:`pipeline.privacy`, :mod:`pipeline.evaluation` or :mod:`pipeline.reporting` (DP-SGD takes
:func:`.rectified.flow_loss` and the network from here, not the other way round).

* :mod:`.rectified` -- x_t = (1 - t) xi + t z with t = 0 the noise end, the target z - xi and the
  per-example loss (eq. 1), uniform times, the guided Euler sampler (Table 9: 25 steps, w = 1.5).
* :mod:`.field` -- :class:`~.field.GaussianMomentModel`: eq. 3 / eq. 4 / eq. 2 in the covariance's
  eigenbasis, Vbar(t), the guided start; the empirical field of a finite set, the cosine curve of
  Fig. 2a and the public horizon tau.
* :mod:`.backbone` -- :class:`~.backbone.FlowSpec` and :func:`~.backbone.build_flow_model`: the
  class-conditional MM-DiT (diffusers ``SD3Transformer2DModel``), vmap-ready; an MLP for the toy.
* :mod:`.train` -- public pretraining (AdamW, EMA, label dropout) and Stage 1 distillation onto
  the analytic field, both through :func:`pipeline.training.loop.run_training`.

Importing the package imports :mod:`.backbone`, which registers the ``sd3_transformer`` backbone
and the ``rectified_flow`` wrapper with :mod:`pipeline.models.checkpoint`, so a flow model file
loads wherever this package is in use (diffusers itself is imported only when a model is built).
"""

from pipeline.flow import backbone  # noqa: F401  (registers the flow model with the checkpoint module)
