"""STRAIGHTDP's workloads: its MM-DiT's DP-SGD step (the rate its cost model reads, ``costs.train_runtime_min``), its
training step (public pretraining, distillation) and its forward (a sampler's step), and how ``make gpu-check``
measures each (:class:`pipeline.rates.MeasuredWorkload`), declared here so the house keeps no list of the methods'
workloads (``METHOD.workloads``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pipeline.rates import DPSGD_FLOP_FACTOR, MeasuredWorkload, Workload

PRESET = "straightdp_kmnist"
#: --tiny: the MM-DiT, its micro-batch and its pretraining batch at a size a CPU runs in seconds (the tests' mode)
TINY = {"straightdp": {"dpsgd": {"micro_batch": 2, "noise_multiplicity": 2},
                       "flow": {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8,
                                "joint_attention_dim": 8, "caption_tokens": 2},
                       "pretrain": {"batch_size": 4}}}
#: images per timed step, at most: one GPU's throughput saturates well below the presets' batches
MAX_BATCH = {"flow_train": 128, "flow_sample": 250}


def _network(config: Mapping[str, Any]) -> Mapping[str, Any]:
    from pipeline.methods.straightdp import costs

    return costs.pixel_network(config)


def _flow_model(config: Mapping[str, Any], batch: int, device: Any) -> tuple[Any, Any, Any]:
    import torch

    from pipeline.flow.backbone import build_flow_model
    from pipeline.flow.backbone import flow_spec
    from pipeline.gpu_check import random_split
    from pipeline.training.data import to_model_scale

    split = random_split(batch, config)
    torch.manual_seed(0)
    model = build_flow_model(flow_spec(config["straightdp"], split, 10)).to(device)
    return model, to_model_scale(split.images).to(device), torch.from_numpy(split.labels).to(device)


def measure_dpsgd(config: Mapping[str, Any], device: Any) -> tuple[Callable[[], None], int]:
    """The flow loss's per-example gradients of ``dpsgd.noise_multiplicity`` time draws on the preset's MM-DiT,
    clipped and summed, over one micro-batch: rule train_straightdp's inner loop."""
    import torch

    from pipeline.flow.backbone import build_flow_model
    from pipeline.flow.rectified import flow_loss
    from pipeline.flow.backbone import flow_spec
    from pipeline.gpu_check import per_example_step, random_split
    from pipeline.privacy import dpsgd, tha
    from pipeline.training.data import to_model_scale

    s = config["straightdp"]
    b, K = int(s["dpsgd"]["micro_batch"]), int(s["dpsgd"]["noise_multiplicity"])
    split = random_split(b, config)
    torch.manual_seed(0)
    model = build_flow_model(flow_spec(s, split, 10)).to(device)
    step = per_example_step(model, dpsgd.multiplicity_loss(flow_loss), to_model_scale(split.images).to(device),
                            dpsgd.NoiseMultiplicity(K, tha.uniform_time_sampler),
                            (torch.from_numpy(split.labels).to(device),), float(s["dpsgd"]["clip_ref"]),
                            str(s["dpsgd"].get("clipping", "auto")))
    return step, b * K


def measure_train(config: Mapping[str, Any], device: Any) -> tuple[Callable[[], None], int]:
    """The MM-DiT's rectified-flow loss, backward and Adam step (rules pretrain_straightdp, train_straightdp's
    distillation)."""
    import torch

    from pipeline.flow.rectified import flow_loss

    p = config["straightdp"]["pretrain"]
    batch = min(int(p["batch_size"]), MAX_BATCH["flow_train"])
    model, z, labels = _flow_model(config, batch, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=float(p["lr"]))
    gen = torch.Generator().manual_seed(0)

    def step() -> None:
        t, xi = torch.rand(batch, generator=gen).to(device), torch.randn(z.shape, generator=gen).to(device)
        loss = flow_loss(model, z, t, xi, labels).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step, batch


def measure_sample(config: Mapping[str, Any], device: Any) -> tuple[Callable[[], None], int]:
    """The MM-DiT's forward alone, a sampler's step (rule sample_straightdp)."""
    import torch

    batch = min(int(config["evaluation"]["batch_size"]), MAX_BATCH["flow_sample"])
    model, z, labels = _flow_model(config, batch, device)
    model.eval()
    t = torch.full((batch,), 0.5, device=device)

    def step() -> None:
        with torch.no_grad():
            model(z, t, labels)

    return step, batch


WORKLOADS = {
    "straightdp_dpsgd": MeasuredWorkload(
        Workload("example-draw: the flow loss's per-example gradient of one time draw, clipped and summed", 16,
                 "pipeline.methods.straightdp.costs:train_runtime_min", "fp32", "flow_mmdit", "train",
                 DPSGD_FLOP_FACTOR),
        preset=PRESET, measure=measure_dpsgd, tiny=TINY, network=_network),
    "flow_train": MeasuredWorkload(
        Workload("image: rectified-flow loss forward, backward and Adam step of STRAIGHTDP's MM-DiT (public "
                 "pretraining, distillation)", None, None, "fp32", "flow_mmdit", "train"),
        preset=PRESET, measure=measure_train, tiny=TINY, network=_network),
    "flow_sample": MeasuredWorkload(
        Workload("image: one evaluation of STRAIGHTDP's MM-DiT (a sampler's step)", None, None, "fp32", "flow_mmdit",
                 "forward"),
        preset=PRESET, measure=measure_sample, tiny=TINY, network=_network),
}
