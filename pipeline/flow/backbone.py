"""STRAIGHTDP's velocity network: a class-conditional MM-DiT built from diffusers' ``SD3Transformer2DModel``.

STRAIGHTDP Table 9 ("Backbone"): a dual-stream DiT (width 192, depth 6, 6 heads, patch 4 at 28x28)
whose caption stream is a frozen public encoder (width 64, length 8). SD3's MM-DiT (Esser et al.
2024) is that architecture: image tokens and caption tokens in two streams coupled by joint
attention, the time and a pooled caption vector entering every block through adaptive norms.
Here the "caption" of a class-conditional model is its label:

* caption stream: a learned table of ``num_classes + 1`` rows, each ``caption_tokens`` (L) tokens
  of width ``joint_attention_dim``; row ``num_classes`` is the NULL label of classifier-free
  guidance (Table 9: p_uncond = 0.1 drops labels to it during training);
* pooled projection: a second table, one ``pooled_projection_dim`` vector per label.

Time: the network speaks ``rectified_flow_t`` (:data:`pipeline.models.denoiser.CONVENTIONS`):
``forward(x, t, y)`` with t in [0, 1], t = 0 the noise end (:mod:`pipeline.flow.rectified`). SD3
runs the same straight path backwards (its sigma = 1 - t is the noise fraction, its timestep
1000 sigma), so the transformer receives timestep = 1000 (1 - t): its sinusoidal embedding sees
the numbers it was designed for (and a frozen SD3 would read a time of ours correctly). The
output is our velocity z - xi (SD3 regresses xi - z; a network trained here learns our sign).

``torch.func``: diffusers' joint attention calls ``F.scaled_dot_product_attention``, whose CPU
flash kernel has no ``vmap`` batching rule: under DP-SGD's ``vmap(grad(...))``
(:func:`pipeline.privacy.dpsgd.per_example_gradients`) it silently falls back to a per-example
loop ("There is a performance drop ..." warning). :class:`MatmulJointAttnProcessor` is the same
joint attention written with matmul and softmax, which vmap batches; every attention module of
the transformer gets it (``tests/flow/test_backbone.py`` checks per-example gradients against a
loop of single-example backward passes, and the equality of the two processors).

A file written by :func:`pipeline.models.checkpoint.save_denoiser` rebuilds this model: importing
this module registers the backbone kind ``"sd3_transformer"`` (spec :class:`FlowSpec`) and the
wrapper ``"rectified_flow"`` (:class:`RectifiedFlowVelocity`) with the checkpoint module
(``pipeline.flow``'s ``__init__`` imports it, so any use of the flow package does).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from pipeline.models.checkpoint import register_backbone, register_denoiser
from pipeline.stage import PipelineError

#: the kind a denoiser file records for an MM-DiT flow backbone, and the wrapper's name
FLOW_BACKBONE = "sd3_transformer"
FLOW_PRECOND = "rectified_flow"
#: SD3's timestep of the noise end (timestep = 1000 sigma, sigma = 1 - t)
SD3_TIMESTEP_SCALE = 1000.0


@dataclass(frozen=True)
class FlowSpec:
    """Architecture of the class-conditional MM-DiT (``SD3Transformer2DModel`` + two label tables).

    Defaults: a tiny 16x16 grey model (width 48 = 3 heads x 16, 2 layers, patch 2, ~170k
    parameters). Paper scale (Table 9): ``image_size=28, patch_size=4, num_layers=6,
    num_attention_heads=6, attention_head_dim=32, caption_projection_dim=192,
    joint_attention_dim=64, caption_tokens=8``. ``num_classes`` = 0 is an unconditional model
    (only the null row). ``caption_projection_dim`` must equal the width
    ``num_attention_heads * attention_head_dim`` (SD3's joint attention projects the caption
    tokens from the transformer width).
    """

    image_size: int = 16
    channels: int = 1
    patch_size: int = 2
    num_layers: int = 2
    attention_head_dim: int = 16
    num_attention_heads: int = 3
    joint_attention_dim: int = 32
    caption_projection_dim: int = 48
    pooled_projection_dim: int = 32
    pos_embed_max_size: int = 8
    caption_tokens: int = 1
    num_classes: int = 0
    #: STRAIGHTDP Sec. 3.3's three backbone constraints, each its own switch (all off: SD3's MM-DiT as is).
    #: ``stream_clamp`` = B0 (None = off): every token of both streams entering a block, and the image
    #: stream leaving the last one, is projected onto the ball of radius B0 (Lemma B.2).
    stream_clamp: float | None = None
    #: ``late_injection`` = l0 (0 = off): cross-modal inflow (attention between the streams and the pooled
    #: label in the adaptive norms) exists only in the last l0 blocks; before them it is an architectural zero.
    late_injection: int = 0
    #: independent softmax normalisers for self- and cross-attention: a block's image update is F(h) + G(h, e).
    decoupled_attention: bool = False
    #: True when the constraints were imposed on weights pretrained without them (Sec. 3.3's collapse
    #: ablation, :func:`impose_post_hoc`); a model trained inside its constraints from step 0 has False.
    post_hoc: bool = False
    #: SD3.5's transformer options, set only by an imported model (:mod:`pipeline.flow.public`): the norm of the
    #: attention queries and keys ("rms_norm") and the blocks with a second, image-only attention
    qk_norm: str | None = None
    dual_attention_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        positive = ("image_size", "channels", "patch_size", "num_layers", "attention_head_dim",
                    "num_attention_heads", "joint_attention_dim", "caption_projection_dim",
                    "pooled_projection_dim", "pos_embed_max_size", "caption_tokens")
        for name in positive:
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"flow backbone: {name} must be an integer >= 1, got {value!r}")
        if not (isinstance(self.num_classes, int) and self.num_classes >= 0):
            raise ValueError(f"flow backbone: num_classes must be an integer >= 0, got {self.num_classes!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"flow backbone: image_size {self.image_size} is not divisible by "
                             f"patch_size {self.patch_size}")
        if self.pos_embed_max_size < self.image_size // self.patch_size:
            raise ValueError(f"flow backbone: pos_embed_max_size must be >= image_size / patch_size = "
                             f"{self.image_size // self.patch_size}, got {self.pos_embed_max_size}")
        if self.stream_clamp is not None and not (isinstance(self.stream_clamp, (int, float))
                                                  and math.isfinite(self.stream_clamp) and self.stream_clamp > 0):
            raise ValueError(f"flow backbone: stream_clamp (B0) must be a number > 0 or null, got {self.stream_clamp!r}")
        if not (isinstance(self.late_injection, int) and 0 <= self.late_injection <= self.num_layers):
            raise ValueError(f"flow backbone: late_injection (l0) must be an integer in [0, num_layers = "
                             f"{self.num_layers}], got {self.late_injection!r}")
        for name in ("decoupled_attention", "post_hoc"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"flow backbone: {name} must be true or false, got {getattr(self, name)!r}")
        if self.post_hoc and not self.constrained:
            raise ValueError("flow backbone: post_hoc is only meaningful with a constraint switched on")
        if self.caption_projection_dim != self.width:
            raise ValueError(f"flow backbone: caption_projection_dim must equal the width num_attention_heads x "
                             f"attention_head_dim = {self.width}, got {self.caption_projection_dim}")
        if self.qk_norm not in (None, "rms_norm", "layer_norm"):
            raise ValueError(f"flow backbone: qk_norm must be null, rms_norm or layer_norm, got {self.qk_norm!r}")
        layers = tuple(self.dual_attention_layers)  # JSON gives a list
        if not all(isinstance(i, int) and 0 <= i < self.num_layers for i in layers):
            raise ValueError(f"flow backbone: dual_attention_layers must be block indices in [0, {self.num_layers}), "
                             f"got {list(layers)}")
        object.__setattr__(self, "dual_attention_layers", layers)

    @property
    def width(self) -> int:
        """The transformer width (SD3's ``inner_dim``)."""
        return self.num_attention_heads * self.attention_head_dim

    @property
    def null_label(self) -> int:
        """The label of the unconditional (classifier-free guidance) branch: the last table row."""
        return self.num_classes

    @property
    def constrained(self) -> bool:
        """Whether any of Sec. 3.3's constraints is on (the forward pass then runs block by block here)."""
        return self.stream_clamp is not None or self.late_injection > 0 or self.decoupled_attention

    def cross_blocks(self) -> range:
        """The blocks with cross-modal inflow: the last l0 under late injection, else every block."""
        first = self.num_layers - self.late_injection if self.late_injection else 0
        return range(first, self.num_layers)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        # SD3.5's options only when set: the files (and resume hashes) of every other spec stay as they were
        if self.qk_norm is None:
            del d["qk_norm"]
        if self.dual_attention_layers:
            d["dual_attention_layers"] = list(self.dual_attention_layers)
        else:
            del d["dual_attention_layers"]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FlowSpec:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"flow backbone: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        return cls(**d)


def clamp_tokens(h: Tensor, B0: float) -> Tensor:
    """Pi_B0(h) = h min(1, B0 / ||h||) per token (norm over the last dim): STRAIGHTDP Sec. 3.3 (1), Lemma B.2.

    The projection onto the centred ball of radius B0 (1-Lipschitz); a token inside the ball is returned
    unchanged bit for bit (the factor is exactly B0 / B0), the zero token included.
    """
    norm = torch.linalg.vector_norm(h, dim=-1, keepdim=True)
    return h * (B0 / norm.clamp(min=B0))


def _attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(Q K^T / sqrt(d)) V over heads ``[B, H, N, D]``, returned as ``[B, N, H*D]``."""
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    out = scores.softmax(dim=-1) @ v
    return out.transpose(1, 2).reshape(q.shape[0], -1, q.shape[1] * q.shape[-1])


class MatmulJointAttnProcessor:
    """diffusers' ``JointAttnProcessor2_0`` (SD3 joint attention) with softmax(Q K^T / sqrt(d)) V written out.

    Same mathematics as the SDPA call it replaces (scale 1/sqrt(head_dim), no mask, no dropout);
    batchable by ``torch.func.vmap`` on every device (see the module docstring).

    Two switches give STRAIGHTDP Sec. 3.3's attention constraints (defaults: SD3's joint attention):

    * ``cross=False``: no cross-modal inflow (late injection outside the last l0 blocks): each stream
      attends to its own tokens only, so the image update does not depend on the caption stream.
    * ``decoupled=True``: self- and cross-attention get independent softmax normalisers, so the image
      update is exactly F(h) + G(h, e): softmax(Q_h K_h^T) V_h + softmax(Q_h K_e^T) V_e, projected by the
      same linear output layer (its bias belongs to F); the caption stream likewise.
    """

    def __init__(self, *, cross: bool = True, decoupled: bool = False) -> None:
        self.cross, self.decoupled = bool(cross), bool(decoupled)

    def __call__(self, attn: nn.Module, hidden_states: Tensor, encoder_hidden_states: Tensor | None = None,
                 attention_mask: Tensor | None = None, *args: Any, **kwargs: Any) -> Tensor | tuple[Tensor, Tensor]:
        if attention_mask is not None:
            raise ValueError("MatmulJointAttnProcessor: attention masks are not supported")
        b, n_img = hidden_states.shape[0], hidden_states.shape[1]

        def heads(u: Tensor) -> Tensor:  # [B, N, H*D] -> [B, H, N, D]
            return u.view(b, -1, attn.heads, u.shape[-1] // attn.heads).transpose(1, 2)

        q, k, v = heads(attn.to_q(hidden_states)), heads(attn.to_k(hidden_states)), heads(attn.to_v(hidden_states))
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            k = attn.norm_k(k)
        if encoder_hidden_states is None:
            out = _attend(q, k, v)
        else:
            cq = heads(attn.add_q_proj(encoder_hidden_states))
            ck = heads(attn.add_k_proj(encoder_hidden_states))
            cv = heads(attn.add_v_proj(encoder_hidden_states))
            if attn.norm_added_q is not None:
                cq = attn.norm_added_q(cq)
            if attn.norm_added_k is not None:
                ck = attn.norm_added_k(ck)
            if not self.cross:
                out, context = _attend(q, k, v), _attend(cq, ck, cv)
            elif self.decoupled:
                out, context = _attend(q, k, v) + _attend(q, ck, cv), _attend(cq, ck, cv) + _attend(cq, k, v)
            else:  # SD3: one softmax over both streams' keys
                joint = _attend(torch.cat([q, cq], dim=2), torch.cat([k, ck], dim=2), torch.cat([v, cv], dim=2))
                out, context = joint[:, :n_img], joint[:, n_img:]
            if not attn.context_pre_only:
                context = attn.to_add_out(context)
        out = attn.to_out[1](attn.to_out[0](out))  # linear projection, dropout
        return (out, context) if encoder_hidden_states is not None else out


class MMDiTBackbone(nn.Module):
    """``SD3Transformer2DModel`` whose caption and pooled inputs are learned label embeddings.

    ``forward(x [B, C, H, W], timestep [B] in SD3 units, labels [B] long) -> [B, C, H, W]``.
    :class:`RectifiedFlowVelocity` turns it into v(x, t, y).
    """

    def __init__(self, spec: FlowSpec) -> None:
        super().__init__()
        from diffusers import SD3Transformer2DModel

        self.spec = spec
        self.transformer = SD3Transformer2DModel(
            sample_size=spec.image_size, patch_size=spec.patch_size, in_channels=spec.channels,
            out_channels=spec.channels, num_layers=spec.num_layers, attention_head_dim=spec.attention_head_dim,
            num_attention_heads=spec.num_attention_heads, joint_attention_dim=spec.joint_attention_dim,
            caption_projection_dim=spec.caption_projection_dim, pooled_projection_dim=spec.pooled_projection_dim,
            pos_embed_max_size=spec.pos_embed_max_size, qk_norm=spec.qk_norm,
            dual_attention_layers=spec.dual_attention_layers)
        self.transformer.set_attn_processor(MatmulJointAttnProcessor())
        cross = spec.cross_blocks()
        for i, block in enumerate(self.transformer.transformer_blocks):
            if spec.decoupled_attention or i not in cross:
                block.attn.set_processor(MatmulJointAttnProcessor(cross=i in cross, decoupled=spec.decoupled_attention))
        self.caption = nn.Embedding(spec.num_classes + 1, spec.caption_tokens * spec.joint_attention_dim)
        self.pooled = nn.Embedding(spec.num_classes + 1, spec.pooled_projection_dim)

    def forward(self, x: Tensor, timestep: Tensor, labels: Tensor) -> Tensor:
        caption = self.caption(labels).view(labels.shape[0], self.spec.caption_tokens, self.spec.joint_attention_dim)
        if self.spec.constrained:
            return self.constrained_forward(x, timestep, caption, self.pooled(labels))
        return self.transformer(x, encoder_hidden_states=caption, pooled_projections=self.pooled(labels),
                                timestep=timestep, return_dict=False)[0]

    def constrained_forward(self, x: Tensor, timestep: Tensor, caption: Tensor, pooled: Tensor,
                            taps: list[tuple[Tensor, Tensor | None]] | None = None) -> Tensor:
        """``SD3Transformer2DModel.forward`` block by block with Sec. 3.3's constraints (see :class:`FlowSpec`).

        Written out because two constraints live between diffusers' calls: the stream clamp acts on the
        streams between blocks, and late injection gives the blocks before the last l0 a time-only
        adaptive-norm embedding (SD3 adds the pooled caption to every block's). With every switch off this
        is SD3's forward (``tests/flow/test_backbone.py`` checks the equality). ``taps``, when given,
        receives each block's output (image stream, caption stream) for the exactness tests.
        """
        tr, spec = self.transformer, self.spec
        height, width = x.shape[-2:]
        h = tr.pos_embed(x).contiguous()
        temb = tr.time_text_embed(timestep, pooled)
        embed = tr.time_text_embed
        temb_time = (embed.timestep_embedder(embed.time_proj(timestep).to(dtype=pooled.dtype))  # no label in it
                     if spec.late_injection else temb)
        e = tr.context_embedder(caption)
        cross = spec.cross_blocks()
        B0 = spec.stream_clamp
        for i, block in enumerate(tr.transformer_blocks):
            if B0 is not None:
                h, e = clamp_tokens(h, B0), clamp_tokens(e, B0)
            e, h = block(hidden_states=h, encoder_hidden_states=e, temb=temb if i in cross else temb_time)
            if taps is not None:
                taps.append((h, e))
        if B0 is not None:
            h = clamp_tokens(h, B0)
        h = tr.proj_out(tr.norm_out(h, temb))
        p, c = tr.config.patch_size, tr.out_channels
        h = h.reshape(h.shape[0], height // p, width // p, p, p, c)
        return torch.einsum("nhwpqc->nchpwq", h).reshape(h.shape[0], c, height, width)


def build_backbone(spec: FlowSpec) -> MMDiTBackbone:
    """The MM-DiT of ``spec`` (weights from torch's global RNG: seed it first).

    A constrained spec gives a model that is constrained from its first forward pass: pretraining a
    model built here optimises inside the constraint set from the start (Sec. 3.3's requirement).
    """
    return MMDiTBackbone(spec)


def impose_post_hoc(model: RectifiedFlowVelocity, **constraints: Any) -> RectifiedFlowVelocity:
    """Sec. 3.3's ablation: the weights of a model pretrained WITHOUT constraints, run inside them.

    A separate path on purpose: the returned model's spec says ``post_hoc=True`` (its file records it),
    so it can never pass for a model trained inside its constraints; the paper reports that this
    collapses the model (0.02 accuracy), the pretrained-inside-constraints route does not.
    """
    spec = model.net.spec
    if spec.constrained:
        raise ValueError("impose_post_hoc: the model already has constraints; post-hoc means imposing them on "
                         "an unconstrained model")
    new = RectifiedFlowVelocity(MMDiTBackbone(replace(spec, **constraints, post_hoc=True)), **model.precond_kwargs())
    new.load_state_dict(model.state_dict())
    return new


def _per_example_t(t: Tensor | float, x: Tensor) -> Tensor:
    t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
    return t.expand(x.shape[0]) if t.ndim == 0 else t


#: what a backbone's output is along x_t = (1 - t) xi + t z: ours is the velocity z - xi (every flow trained here);
#: SD3's is xi - z (Esser et al. 2024 regress the noise minus the data), so an imported SD3 model's is negated
PREDICTIONS = {"data_minus_noise": 1.0, "noise_minus_data": -1.0}
DEFAULT_PREDICTION = "data_minus_noise"


class RectifiedFlowVelocity(nn.Module):
    """v(x, t, class_labels) of the ``rectified_flow_t`` convention around a backbone in SD3's time units.

    The backbone gets timestep = ``timestep_scale`` (1 - t) (SD3's sigma = 1 - t, timestep 1000
    sigma) and the labels, ``null_label`` when ``class_labels`` is None. ``t`` is a float or ``[B]``.
    ``prediction`` (a key of :data:`PREDICTIONS`) is what the backbone outputs; the wrapper always
    returns the velocity z - xi.
    """

    convention: ClassVar[str] = "rectified_flow_t"

    def __init__(self, net: nn.Module, timestep_scale: float = SD3_TIMESTEP_SCALE,
                 prediction: str = DEFAULT_PREDICTION) -> None:
        super().__init__()
        if prediction not in PREDICTIONS:
            raise ValueError(f"flow prediction must be one of {', '.join(PREDICTIONS)}, got {prediction!r}")
        self.net, self.timestep_scale, self.prediction = net, float(timestep_scale), prediction

    @property
    def null_label(self) -> int:
        return self.net.spec.null_label

    def precond_kwargs(self) -> dict[str, Any]:
        """What :func:`pipeline.models.checkpoint.save_denoiser` records to rebuild this wrapper (the defaults
        are left out: files of flows trained here stay as they were)."""
        out: dict[str, Any] = {}
        if self.timestep_scale != SD3_TIMESTEP_SCALE:
            out["timestep_scale"] = self.timestep_scale
        if self.prediction != DEFAULT_PREDICTION:
            out["prediction"] = self.prediction
        return out

    def forward(self, x: Tensor, t: Tensor | float, class_labels: Tensor | None = None) -> Tensor:
        t = _per_example_t(t, x)
        if class_labels is None:
            class_labels = torch.full((x.shape[0],), self.null_label, dtype=torch.long, device=x.device)
        out = self.net(x, self.timestep_scale * (1 - t), class_labels)
        return out if self.prediction == DEFAULT_PREDICTION else PREDICTIONS[self.prediction] * out


def build_flow_model(spec: FlowSpec) -> RectifiedFlowVelocity:
    """The class-conditional velocity network v(x, t, y) of ``spec`` (seed torch's global RNG first)."""
    return RectifiedFlowVelocity(build_backbone(spec))


def flow_spec(cfg: Mapping[str, Any], split: Any, n_classes: int) -> FlowSpec:
    """The MM-DiT of ``cfg["flow"]`` (the ``flow`` subsection of a STRAIGHTDP configuration) for the images of
    ``split`` (its ``images`` ``[N, C, H, W]``: only their shape is read) and ``n_classes`` labels."""
    f = cfg["flow"]
    _, channels, size, _ = split.images.shape
    heads, head_dim = int(f["num_attention_heads"]), int(f["attention_head_dim"])
    try:
        return FlowSpec(image_size=int(size), channels=int(channels), patch_size=int(f["patch_size"]),
                        num_layers=int(f["num_layers"]), attention_head_dim=head_dim, num_attention_heads=heads,
                        joint_attention_dim=int(f["joint_attention_dim"]), caption_projection_dim=heads * head_dim,
                        pooled_projection_dim=int(f["joint_attention_dim"]),
                        pos_embed_max_size=int(size) // int(f["patch_size"]), caption_tokens=int(f["caption_tokens"]),
                        num_classes=int(n_classes),
                        stream_clamp=None if f.get("stream_clamp") is None else float(f["stream_clamp"]),
                        late_injection=int(f.get("late_injection", 0)),
                        decoupled_attention=bool(f.get("decoupled_attention", False)))
    except ValueError as exc:
        raise PipelineError(f"param straightdp.flow: {exc}") from None


register_backbone(FLOW_BACKBONE, FlowSpec, build_backbone)
register_denoiser(FLOW_PRECOND, RectifiedFlowVelocity)


# --------------------------------------------------------------------------- the 2-D toy

class MLPVelocity(nn.Module):
    """A small class-conditional velocity MLP on R^d for the 2-D Gaussian-mixture toy (STRAIGHTDP Fig. 6).

    v(x, t, y) = MLP([x, sin/cos features of t, label embedding]); ``num_classes + 1`` label rows,
    the last one the null label. Same interface as :class:`RectifiedFlowVelocity`.
    """

    convention: ClassVar[str] = "rectified_flow_t"

    def __init__(self, dim: int, *, num_classes: int = 0, hidden: int = 64, depth: int = 2, time_features: int = 8,
                 label_dim: int = 8) -> None:
        super().__init__()
        if not (dim >= 1 and hidden >= 1 and depth >= 1 and time_features >= 1):
            raise ValueError(f"MLPVelocity: dim, hidden, depth, time_features must be >= 1, got "
                             f"{dim}, {hidden}, {depth}, {time_features}")
        self.num_classes = int(num_classes)
        self.register_buffer("freqs", math.pi * torch.arange(1, time_features + 1, dtype=torch.float32))
        self.label = nn.Embedding(num_classes + 1, label_dim)
        layers: list[nn.Module] = []
        width = dim + 2 * time_features + label_dim
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.SiLU()]
            width = hidden
        layers.append(nn.Linear(width, dim))
        self.mlp = nn.Sequential(*layers)

    @property
    def null_label(self) -> int:
        return self.num_classes

    def forward(self, x: Tensor, t: Tensor | float, class_labels: Tensor | None = None) -> Tensor:
        t = _per_example_t(t, x)
        if class_labels is None:
            class_labels = torch.full((x.shape[0],), self.null_label, dtype=torch.long, device=x.device)
        angles = t[:, None].to(self.freqs.dtype) * self.freqs
        feats = torch.cat([x, angles.sin().to(x.dtype), angles.cos().to(x.dtype), self.label(class_labels).to(x.dtype)],
                          dim=1)
        return self.mlp(feats)
