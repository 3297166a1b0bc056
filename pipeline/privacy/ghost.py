"""Per-example clipping without per-example gradients: mixed ghost clipping with book-keeping.

DP-SGD needs, per example i, the norm ||g_i|| of its gradient over ALL parameters and then the clipped
sum sum_i c_i g_i with c_i = C / max(||g_i||, C) (:func:`pipeline.privacy.dpsgd.clip_and_sum`).
``vmap(grad(...))`` materialises every g_i: B copies of the model's gradient. For a layer whose output
is a linear function of its weight, the per-example gradient factors through what an ordinary backward
pass already has (Goodfellow 2015; Li et al. 2022 "ghost clipping"; Bu et al. 2023, "Differentially
private optimization on large model at small cost", Sec. 3, the book-keeping (BK) algorithm):

* **Linear** y_t = W a_t + b over the T_i tokens t of example i (noise multiplicity's K draws and a
  transformer's tokens are all tokens of the example): dL_i/dW = sum_t g_t a_t^T, dL_i/db = sum_t g_t,
  with g_t = dL/dy_t. Its squared Frobenius norm is either the **ghost norm**
  ||sum_t g_t a_t^T||^2 = sum_{t,t'} (a_t . a_t')(g_t . g_t') (Bu et al. eq. 3: cost T_i^2 (p + d),
  never forms the p x d matrix) or the **instantiated** one, forming sum_t g_t a_t^T (cost T_i p d,
  memory p d per example). "Mixed" (Bu et al. Sec. 3.2) takes per layer the cheaper of the two, from
  the shapes alone (:func:`ghost_is_cheaper`).
* **Conv2d** is a Linear over unfolded patches: a_t the (C_in kh kw) patch at output position t.
* **GroupNorm / LayerNorm** y = x_hat w + b: dL_i/dw = sum g * x_hat over the example's positions,
  instantiated (w has C entries); x_hat is recomputed from the layer's input without its affine.
* **Embedding** rows: dL_i/dE = sum_t e_{idx_t} g_t^T, ghost norm sum_{t,t'} [idx_t = idx_t'] (g_t . g_t').

Book-keeping: ONE forward and ONE backward to the layers' outputs (``torch.autograd.grad`` to the
captured outputs: the non-private weight gradients are never formed), the per-example norms from the
kept activations a and output gradients g, then each layer's clipped sum
sum_i c_i dL_i/dW = sum_t (c_{i(t)} g_t) a_t^T from the same a and g: no second backward pass.

Why written here: Opacus' ghost clipping (``GradSampleModuleFastGradientClipping``) covers Linear and
Embedding and falls back to hooks for convolutions (measured 2.67x a non-private step on the embedded
UNet, ``benchmarks/bench_dpsgd_step.py``), and no maintained library does mixed ghost norms with
book-keeping for Conv2d and GroupNorm. The mechanism is unchanged: the same clipped sum (to float
rounding; ``tests/privacy/test_ghost.py`` checks it against ``vmap`` on every backbone here), then the
engine's one Gaussian draw, so the ledger line is the same.

Preconditions, checked by :func:`unsupported_parameters` (the engine falls back to ``vmap`` under
``clipping: auto`` and refuses under ``ghost``): every trainable parameter belongs to a module of
:data:`SUPPORTED` in a configuration handled here; no module mixes examples (no BatchNorm); every module
sees the rows of the batch in order, K consecutive rows per example.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: the modules whose parameters' per-example norms and clipped sums are computed here
SUPPORTED = (nn.Linear, nn.Conv2d, nn.GroupNorm, nn.LayerNorm, nn.Embedding)

#: ``batched_loss(model, *chunk) -> [B]``: every example's loss from ONE batched forward of ``model``
BatchedLoss = Callable[..., Tensor]


def _why_unsupported(module: nn.Module) -> str | None:
    """Why this module's parameters cannot be handled here (None: they can)."""
    if isinstance(module, nn.Conv2d):
        if module.groups != 1:
            return "grouped convolution"
        if module.padding_mode != "zeros" or isinstance(module.padding, str):
            return f"padding {module.padding!r} ({module.padding_mode})"
    if isinstance(module, nn.Embedding) and (module.max_norm is not None or module.scale_grad_by_freq
                                             or module.sparse):
        return "embedding with max_norm, scale_grad_by_freq or sparse gradients"
    return None


def unsupported_parameters(model: nn.Module) -> list[str]:
    """Names of trainable parameters ghost clipping cannot handle (with the reason); empty when it can."""
    out = []
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            name = f"{mname}.{pname}" if mname else pname
            if not isinstance(module, SUPPORTED):
                out.append(f"{name} ({type(module).__name__})")
            elif (why := _why_unsupported(module)) is not None:
                out.append(f"{name} ({why})")
    return out


def ghost_is_cheaper(tokens: int, d_in: int, d_out: int) -> bool:
    """Bu et al. 2023 Sec. 3.2: the ghost norm costs ~T^2 (p + d), instantiation ~T p d (and p d memory)."""
    return tokens * (d_in + d_out) < d_in * d_out


@dataclass
class _Layer:
    module: nn.Module
    inputs: list[Tensor] = field(default_factory=list)  # what the layer's weight multiplies (or x_hat, indices)
    outputs: list[Tensor] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # each output's version counter when it was made


def _trainable(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters(recurse=False))


def _saved_input(module: nn.Module, x: Tensor) -> Tensor:
    """What the book-keeping needs from a layer's input (detached): itself, or the normalised x_hat."""
    x = x.detach()
    if isinstance(module, nn.GroupNorm):
        return F.group_norm(x, module.num_groups, eps=module.eps)
    if isinstance(module, nn.LayerNorm):
        return F.layer_norm(x, module.normalized_shape, eps=module.eps)
    return x


def _linear_tokens(a: Tensor, g: Tensor, B: int) -> tuple[Tensor, Tensor]:
    """A Linear's (inputs ``[B, T_i, p]``, output gradients ``[B, T_i, d]``) per example (K rows each)."""
    return a.reshape(B, -1, a.shape[-1]), g.reshape(B, -1, g.shape[-1])


def _conv_tokens(module: nn.Conv2d, a: Tensor, g: Tensor, B: int) -> tuple[Tensor, Tensor]:
    """A Conv2d's (unfolded patches ``[B, T_i, C_in kh kw]``, output gradients ``[B, T_i, C_out]``) per example."""
    u = F.unfold(a, module.kernel_size, dilation=module.dilation, padding=module.padding, stride=module.stride)
    return u.transpose(1, 2).reshape(B, -1, u.shape[1]), g.flatten(2).transpose(1, 2).reshape(B, -1, g.shape[1])


def _conv_weight_grads(module: nn.Conv2d, a: Tensor, g: Tensor, B: int) -> Tensor:
    """Per-example conv weight gradients ``[B, *weight.shape]``: torch's own weight-gradient convolution per
    example (batched by vmap: no unfolded copy of the input, which costs more than the convolution)."""
    from torch.func import vmap

    def one(a_i: Tensor, g_i: Tensor) -> Tensor:
        return torch.nn.grad.conv2d_weight(a_i, module.weight.shape, g_i, stride=module.stride,
                                           padding=module.padding, dilation=module.dilation)

    return vmap(one)(a.reshape(B, -1, *a.shape[1:]), g.reshape(B, -1, *g.shape[1:]))


def _norm_layer_grads(module: nn.Module, x_hat: Tensor, g: Tensor, B: int) -> tuple[Tensor, Tensor]:
    """Per-example (dL/dw, dL/db) of a GroupNorm (``[B, C]``) or LayerNorm (``[B, *normalized_shape]``)."""
    if isinstance(module, nn.GroupNorm):
        dims = tuple(range(2, g.ndim))
        gw, gb = (g * x_hat).sum(dims), g.sum(dims)  # [N, C]
        return gw.reshape(B, -1, gw.shape[1]).sum(1), gb.reshape(B, -1, gb.shape[1]).sum(1)
    shape = tuple(module.normalized_shape)
    return (g * x_hat).reshape(B, -1, *shape).sum(1), g.reshape(B, -1, *shape).sum(1)


def _bias_grads(g: Tensor, conv: bool, B: int) -> Tensor:
    """Per-example bias gradients ``[B, d]`` of a Linear or Conv2d: its output gradients summed over each row's
    positions (``[N rows, d]``), then over the example's K rows."""
    rows = g.flatten(2).sum(2) if conv else g.reshape(g.shape[0], -1, g.shape[-1]).sum(1)
    return rows.reshape(B, -1, rows.shape[-1]).sum(1)


def _cat(parts: list[Tensor]) -> Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


#: ``finish(c [B]) -> {parameter name: sum_i c_i dL_i/dp}``: a layer's clipped sums once the norms are known
Finish = Callable[[Tensor], dict[str, Tensor]]


def _instantiated(grads: dict[str, Tensor]) -> tuple[Tensor, Finish]:
    """Per-example gradients ``{name: [B, ...]}`` formed: their squared norms, and the clipped sums from them."""
    sq = sum(t.flatten(1).pow(2).sum(1) for t in grads.values())
    return sq, lambda c: {k: torch.einsum("b,b...->...", c.to(t.dtype), t) for k, t in grads.items()}


def _book(module: nn.Module, calls: list[tuple[Tensor, Tensor]], B: int) -> tuple[Tensor, Finish]:
    """One layer's per-example squared norms ``[B]`` and its :data:`Finish`, over ALL its calls in the forward (a
    layer called twice, e.g. a reused time embedding, has as per-example gradient the SUM over the calls)."""
    w, b = module.weight, getattr(module, "bias", None)
    train_w, train_b = w is not None and w.requires_grad, b is not None and b.requires_grad
    if isinstance(module, nn.Embedding):
        idx = _cat([a.reshape(B, -1) for a, _ in calls])
        g = _cat([gg.reshape(B, -1, gg.shape[-1]) for _, gg in calls])
        same = idx[:, :, None] == idx[:, None, :]
        keep = None
        if module.padding_idx is not None:  # PyTorch gives the padding row no gradient
            keep = idx != module.padding_idx
            same = same & keep[:, :, None] & keep[:, None, :]
        sq = (same.to(g.dtype) * (g @ g.transpose(1, 2))).sum((1, 2))

        def finish_embedding(c: Tensor) -> dict[str, Tensor]:
            gc = (g * c.to(g.dtype)[:, None, None]).reshape(-1, g.shape[-1])
            if keep is not None:
                gc = gc * keep.reshape(-1, 1).to(gc.dtype)
            return {"weight": torch.zeros_like(w).index_add_(0, idx.reshape(-1), gc)}

        return sq, finish_embedding
    if isinstance(module, (nn.GroupNorm, nn.LayerNorm)):
        grads = [_norm_layer_grads(module, a, g, B) for a, g in calls]
        return _instantiated({**({"weight": sum(gw for gw, _ in grads)} if train_w else {}),
                              **({"bias": sum(gb for _, gb in grads)} if train_b else {})})
    # Linear / Conv2d: the bias's per-example gradient is the output gradient summed over the example's tokens
    conv = isinstance(module, nn.Conv2d)
    per_ex: dict[str, Tensor] = {}
    if train_b:
        per_ex["bias"] = sum(_bias_grads(g, conv, B) for _, g in calls)
    if not train_w:
        return _instantiated(per_ex)
    d_out, d_in = w.shape[0], w[0].numel()
    tokens = sum((a.shape[0] // B) * (g[0, 0].numel() if conv else g[0].numel() // d_out) for a, g in calls)
    if not ghost_is_cheaper(tokens, d_in, d_out):
        per_ex["weight"] = sum((_conv_weight_grads(module, a, g, B) if conv else
                                torch.einsum("bto,bti->boi", *reversed(_linear_tokens(a, g, B))))
                               for a, g in calls)
        return _instantiated(per_ex)
    pairs = [_conv_tokens(module, a, g, B) if conv else _linear_tokens(a, g, B) for a, g in calls]
    A, G = _cat([a for a, _ in pairs]), _cat([g for _, g in pairs])  # [B, T_i, p], [B, T_i, d]
    sq_b, finish_b = _instantiated(per_ex)
    sq = sq_b + ((A @ A.transpose(1, 2)) * (G @ G.transpose(1, 2))).sum((1, 2))  # Bu et al. eq. 3

    def finish_ghost(c: Tensor) -> dict[str, Tensor]:
        out = finish_b(c)
        out["weight"] = torch.einsum("bto,bti->oi", G * c.to(G.dtype)[:, None, None], A).reshape(w.shape)
        return out

    return sq, finish_ghost


def ghost_clip_and_sum(model: nn.Module, batched_loss: BatchedLoss, chunk: Sequence[Tensor], max_grad_norm: float
                       ) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """The clipped sum ``{name: sum_i clip_C(g_i)}`` over the trainable parameters, the per-example norms ``[B]``
    BEFORE clipping and the losses ``[B]``: what ``clip_and_sum(per_example_gradients(...))`` gives, without
    per-example gradients (one forward, one backward to the layers' outputs; see the module docstring).

    ``batched_loss(model, *chunk)`` returns each example's loss ``[B]`` (B = ``len(chunk[0])``); every layer
    must see ``B * K`` rows, K consecutive per example.
    """
    bad = unsupported_parameters(model)
    if bad:
        raise ValueError(f"ghost clipping cannot handle {bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}"
                         " (use dpsgd.clipping: vmap)")
    B = int(chunk[0].shape[0])
    layers: dict[str, _Layer] = {}
    handles = []

    def hook(name: str) -> Callable[..., None]:
        def capture(module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> None:
            if not torch.is_grad_enabled():
                return
            layer = layers.setdefault(name, _Layer(module))
            layer.inputs.append(_saved_input(module, args[0]))
            layer.outputs.append(output)
            layer.versions.append(output._version)
        return capture

    for name, module in model.named_modules():
        if isinstance(module, SUPPORTED) and _trainable(module):
            handles.append(module.register_forward_hook(hook(name)))
    try:
        losses = batched_loss(model, *chunk)
    finally:
        for h in handles:
            h.remove()
    if losses.shape != (B,):
        raise ValueError(f"ghost clipping: the batched loss must be one value per example, shape [{B}], "
                         f"got {list(losses.shape)}")
    outputs = [o for layer in layers.values() for o in layer.outputs]
    for name, layer in layers.items():
        # the gradient would be taken at the tensor's later value (torch.autograd.grad follows the tensor object)
        if any(o._version != v for o, v in zip(layer.outputs, layer.versions)):
            raise ValueError(f"ghost clipping: the output of {name or 'the model'} ({type(layer.module).__name__}) "
                             "is modified in place later in the forward; use dpsgd.clipping: vmap")
    grads = torch.autograd.grad(losses.sum(), outputs, allow_unused=True) if outputs else ()
    it = iter(grads)
    finishes: list[tuple[str, Finish]] = []
    sq = torch.zeros(B, dtype=losses.dtype, device=losses.device)
    for name, layer in layers.items():
        calls = []
        for a in layer.inputs:
            g = next(it)
            if g is None:  # this call's output did not reach the loss
                continue
            if a.shape[0] % B or g.shape[0] != a.shape[0]:
                raise ValueError(f"ghost clipping: a {type(layer.module).__name__} saw {a.shape[0]} rows, not a "
                                 f"multiple of the {B} examples")
            calls.append((a, g.detach()))
        if calls:
            layer_sq, finish = _book(layer.module, calls, B)
            sq = sq + layer_sq.to(sq.dtype)
            finishes.append((name, finish))
        layer.inputs.clear()
        layer.outputs.clear()
    norms = sq.sqrt()
    c = max_grad_norm / torch.clamp(norms, min=max_grad_norm)
    summed: dict[str, Tensor] = {}
    for prefix, finish in finishes:
        for pname, t in finish(c).items():
            summed[f"{prefix}.{pname}" if prefix else pname] = t
    for name, p in model.named_parameters():  # parameters whose layer did not reach the loss: zero gradient
        if p.requires_grad and name not in summed:
            summed[name] = torch.zeros_like(p)
    return summed, norms.detach(), losses.detach()
