"""LoRA adapters on a frozen flow model (STRAIGHTDP Sec. 4, Table 3: "DP-LoRA fine-tuning of the frozen
SD3-medium"), with peft.

The frozen-model route: the public flow's weights stay as they are and only low-rank adapters
W + (alpha / r) B A on the joint attention's projections (both streams: ``to_q/k/v``, ``to_out.0``,
``add_q/k/v_proj``, ``to_add_out``) are trained, by the same DP-SGD engine as every other STRAIGHTDP run
(``dpsgd.trainable_parameters`` sees the adapters only: the clip bounds their per-example gradients).
B starts at zero (peft's default), so an adapted model starts as the public one exactly. After training
the adapters are merged into the weights (:func:`merge_lora`, post-processing): the result is an ordinary
flow checkpoint that the sampler and evaluation read unchanged.

The same functions take diffusers' ``SD3Transformer2DModel`` at any size (the backbone here is one; a
user with SD3-medium weights points ``straightdp.lora`` at the same module names).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

#: the joint attention's projections in diffusers' SD3 blocks (image stream, caption stream, outputs)
ATTENTION_PROJECTIONS = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")


def add_lora(model: nn.Module, *, rank: int, alpha: float,
             targets: Sequence[str] = ATTENTION_PROJECTIONS) -> nn.Module:
    """Freeze every weight of ``model`` and inject rank-``rank`` LoRA adapters into the ``targets`` modules
    (in place; returned for chaining). Only the adapters require gradients afterwards."""
    from peft import LoraConfig, inject_adapter_in_model

    if not (isinstance(rank, int) and rank >= 1):
        raise ValueError(f"LoRA rank must be an integer >= 1, got {rank!r}")
    if not alpha > 0:
        raise ValueError(f"LoRA alpha must be > 0, got {alpha!r}")
    model.requires_grad_(False)
    config = LoraConfig(r=rank, lora_alpha=float(alpha), lora_dropout=0.0, target_modules=list(targets),
                        bias="none")
    inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return model


def lora_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    from peft.tuners.lora import LoraLayer

    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoraLayer)]


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Merge every adapter into its base weight and put the base module back in its place (in place):
    the model then has the original module names and state-dict keys."""
    for name, layer in lora_layers(model):
        layer.merge()
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, layer.get_base_layer())
    return model
