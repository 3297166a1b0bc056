"""DPDM's workload: the DP-SGD training step its cost model runs at (``costs.train_runtime_min``), and how
``make gpu-check`` measures it (:class:`pipeline.rates.MeasuredWorkload`), declared here so the house keeps no list
of the methods' workloads (``METHOD.workloads``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pipeline.rates import DPSGD_FLOP_FACTOR, MeasuredWorkload, Workload

#: --tiny: DPDM's UNet and micro-batch at a size a CPU runs in seconds (the tests' mode; not a paper workload)
TINY = {"dpdm": {"micro_batch": 2, "K": 2, "unet": {"block_out_channels": [16, 16], "attention": [False, True],
                                                    "layers_per_block": 1, "norm_num_groups": 8}}}


def _network(config: Mapping[str, Any]) -> Mapping[str, Any]:
    from pipeline.methods.dpdm import costs

    return costs.network(config)


def measure_dpsgd(config: Mapping[str, Any], device: Any) -> tuple[Callable[[], None], int]:
    """DP-SGD's per-example gradients of ``dpdm.K`` draws each (:func:`pipeline.privacy.dpsgd.per_example_gradients`),
    clipped and summed, over one micro-batch of ``dpdm.micro_batch`` examples: rule train_dpdm's inner loop."""
    import torch

    from pipeline.gpu_check import per_example_step, random_split
    from pipeline.models.precond import parameterisation
    from pipeline.models.unet import build_unet
    from pipeline.privacy import dpsgd
    from pipeline.training.data import to_model_scale, unet_spec_for

    d = config["dpdm"]
    b, K = int(d["micro_batch"]), int(d["K"])
    split = random_split(b, config)
    spec = unet_spec_for(d["unet"], split, class_conditional=d["class_conditional"], num_classes=10)
    param = parameterisation(d["parameterisation"])
    torch.manual_seed(0)
    model = param.build(build_unet(spec)).to(device)
    cond = (torch.from_numpy(split.labels).to(device),) if spec.num_classes else ()
    step = per_example_step(model, dpsgd.multiplicity_loss(param.draw_loss), to_model_scale(split.images).to(device),
                            dpsgd.NoiseMultiplicity(K, param.sigma_sampler), cond, float(d["clip"]),
                            str(d.get("clipping", "auto")))
    return step, b * K


WORKLOADS = {
    "dpdm_dpsgd": MeasuredWorkload(
        Workload("example-draw: one of an example's K noise draws, per-example gradient clipped and summed", 16,
                 "pipeline.methods.dpdm.costs:train_runtime_min", "tf32", "edm_unet", "train", DPSGD_FLOP_FACTOR),
        preset="mnist", measure=measure_dpsgd, tiny=TINY, network=_network),
}
