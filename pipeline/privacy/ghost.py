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


def _per_example(t: Tensor, B: int) -> Tensor:
    """``[B*K, ...]`` rows -> ``[B, K*...]`` tokens of each example (K consecutive rows per example)."""
    return t.reshape(B, -1, *t.shape[2:]) if t.ndim > 2 else t.reshape(B, -1)


def _tokens(module: nn.Module, a: Tensor, g: Tensor, B: int) -> tuple[Tensor, Tensor]:
    """A Linear or Conv2d's (activations ``[B, T_i, p]``, output gradients ``[B, T_i, d]``) per example."""
    if isinstance(module, nn.Conv2d):
        a = F.unfold(a, module.kernel_size, dilation=module.dilation, padding=module.padding,
                     stride=module.stride).transpose(1, 2)  # [N, L, C_in kh kw]
        g = g.flatten(2).transpose(1, 2)  # [N, L, C_out]
    return a.reshape(B, -1, a.shape[-1]), g.reshape(B, -1, g.shape[-1])


def _combined(module: nn.Module, calls: list[tuple[Tensor, Tensor]], B: int) -> tuple[Tensor, ...]:
    """One layer's per-example book-keeping over ALL its calls in the forward (a layer called twice, e.g. a
    time embedding reused, has as per-example gradient the SUM over the calls): Linear/Conv2d and Embedding
    (activations or indices, output gradients) with the calls' tokens side by side; a norm layer its summed
    per-example (dL/dw, dL/db)."""
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        pairs = [_tokens(module, a, g, B) for a, g in calls]
        return torch.cat([a for a, _ in pairs], 1), torch.cat([g for _, g in pairs], 1)
    if isinstance(module, nn.Embedding):
        return (torch.cat([a.reshape(B, -1) for a, _ in calls], 1),
                torch.cat([g.reshape(B, -1, g.shape[-1]) for _, g in calls], 1))
    grads = [_norm_layer_grads(module, a, g, B) for a, g in calls]
    return sum(gw for gw, _ in grads), sum(gb for _, gb in grads)


def _sq_norms(module: nn.Module, book: tuple[Tensor, ...], B: int) -> Tensor:
    """Per-example squared gradient norm ``[B]`` of the module's trainable parameters, from :func:`_combined`."""
    w, b = module.weight, getattr(module, "bias", None)
    sq = torch.zeros(B, dtype=book[-1].dtype, device=book[-1].device)
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        a, g = book
        if w.requires_grad:
            if ghost_is_cheaper(a.shape[1], a.shape[2], g.shape[2]):
                sq = sq + ((a @ a.transpose(1, 2)) * (g @ g.transpose(1, 2))).sum((1, 2))
            else:
                sq = sq + torch.einsum("bto,bti->boi", g, a).pow(2).sum((1, 2))
        if b is not None and b.requires_grad:
            sq = sq + g.sum(1).pow(2).sum(1)
    elif isinstance(module, nn.Embedding):
        idx, g = book
        same = idx[:, :, None] == idx[:, None, :]
        if module.padding_idx is not None:  # PyTorch gives the padding row no gradient
            keep = idx != module.padding_idx
            same = same & keep[:, :, None] & keep[:, None, :]
        sq = sq + (same.to(g.dtype) * (g @ g.transpose(1, 2))).sum((1, 2))
    else:  # GroupNorm / LayerNorm: per-example (dL/dw, dL/db)
        gw, gb = book
        if w is not None and w.requires_grad:
            sq = sq + gw.flatten(1).pow(2).sum(1)
        if b is not None and b.requires_grad:
            sq = sq + gb.flatten(1).pow(2).sum(1)
    return sq


def _norm_layer_grads(module: nn.Module, x_hat: Tensor, g: Tensor, B: int) -> tuple[Tensor, Tensor]:
    """Per-example (dL/dw, dL/db) of a GroupNorm (``[B, C]``) or LayerNorm (``[B, *normalized_shape]``)."""
    if isinstance(module, nn.GroupNorm):
        dims = tuple(range(2, g.ndim))
        gw, gb = (g * x_hat).sum(dims), g.sum(dims)  # [N, C]
        return gw.reshape(B, -1, gw.shape[1]).sum(1), gb.reshape(B, -1, gb.shape[1]).sum(1)
    shape = tuple(module.normalized_shape)
    gw = (g * x_hat).reshape(B, -1, *shape).sum(1)
    gb = g.reshape(B, -1, *shape).sum(1)
    return gw, gb


def _clipped_sums(module: nn.Module, book: tuple[Tensor, ...], c: Tensor) -> dict[str, Tensor]:
    """sum_i c_i dL_i/dp for the module's trainable parameters ``p`` (book-keeping: from :func:`_combined`)."""
    w, b = module.weight, getattr(module, "bias", None)
    out: dict[str, Tensor] = {}
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        a, g = book
        gc = g * c[:, None, None]
        if w.requires_grad:
            out["weight"] = torch.einsum("bto,bti->oi", gc, a).reshape(w.shape)
        if b is not None and b.requires_grad:
            out["bias"] = gc.sum((0, 1))
    elif isinstance(module, nn.Embedding):
        idx, g = book
        idx, g = idx.reshape(-1), (g * c[:, None, None]).reshape(-1, g.shape[-1])
        if module.padding_idx is not None:
            g = g * (idx != module.padding_idx).to(g.dtype)[:, None]
        out["weight"] = torch.zeros_like(w).index_add_(0, idx, g)
    else:
        gw, gb = book
        if w is not None and w.requires_grad:
            out["weight"] = torch.einsum("b,b...->...", c, gw)
        if b is not None and b.requires_grad:
            out["bias"] = torch.einsum("b,b...->...", c, gb)
    return out


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
    grads = torch.autograd.grad(losses.sum(), outputs, allow_unused=True) if outputs else ()
    it = iter(grads)
    books: list[tuple[_Layer, tuple[Tensor, ...]]] = []
    sq = torch.zeros(B, dtype=losses.dtype, device=losses.device)
    for layer in layers.values():
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
            book = _combined(layer.module, calls, B)
            sq = sq + _sq_norms(layer.module, book, B).to(sq.dtype)
            books.append((layer, book))
    norms = sq.sqrt()
    c = max_grad_norm / torch.clamp(norms, min=max_grad_norm)
    names = {id(m): n for n, m in model.named_modules()}
    summed: dict[str, Tensor] = {}
    for layer, book in books:
        prefix = names[id(layer.module)]
        for pname, t in _clipped_sums(layer.module, book, c.to(book[-1].dtype)).items():
            summed[f"{prefix}.{pname}" if prefix else pname] = t
    for name, p in model.named_parameters():  # parameters whose layer did not reach the loss: zero gradient
        if p.requires_grad and name not in summed:
            summed[name] = torch.zeros_like(p)
    return summed, norms.detach(), losses.detach()
