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

Preconditions. Ghost clipping is correct only where each trainable parameter enters the loss through calls of its own
module's ``forward`` (so those calls' inputs and output gradients ARE its gradient), the norm rule above is that
forward's, and each call sees the examples in rows, K consecutive per example, computed from that example alone.
The guard checks each of them, and where it cannot verify one it refuses with :class:`GhostUnsupported`, a one-line
error naming the module. ``vmap_ok`` says whether per-example gradients from ``vmap`` are correct there: the engine
under ``clipping: auto`` then falls back to them, under ``ghost`` it stops.

* statically (:func:`unsupported_parameters`, also what ``dpsgd.resolve_clipping`` reads before any data): every
  trainable parameter is of a :data:`SUPPORTED` layer that keeps its base class's ``forward``, in a configuration
  handled here, owned by one module only and not inside a module that feeds its children's weights to a
  functional kernel (:data:`FUNCTIONAL_PARENTS`: ``nn.MultiheadAttention.out_proj``);
* statically (:func:`batch_mixing_modules`): no module mixes examples (a BatchNorm normalising with the batch's
  statistics, a norm layer writing the batch's running statistics into the model). No engine has a per-example
  gradient there (vmap would normalise over one example's K draws: another model), so this refuses under ``auto``;
* on each call, by observing the use: the autograd graph of the losses consumes every trainable parameter only inside
  a captured call of its own module (a weight tied into a later ``F.linear``, or one handed to a functional kernel,
  is refused), and no captured input or output is modified in place later;
* once per model, loss and layout of shapes, by a probe: one extra backward with the examples' losses weighted by
  powers of two that differ between neighbouring examples. If every call's rows belong to the examples as assumed,
  each row's output gradient is the plain one times its own example's weight, exactly (scaling by a power of two
  commutes with rounding); a sequence-first input (``[T, B K, d]``), or a later op mixing rows across examples,
  breaks that (:func:`_probe_weights`).

Not seen: examples mixed by a bare tensor function (``x - x.mean(0)``) before every trainable layer, and a parameter
used only inside reentrant ``torch.utils.checkpoint`` (its forward runs without gradients, its use is not in the graph).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.graph import Node

#: the modules whose parameters' per-example norms and clipped sums are computed here (a subclass only while it keeps
#: its base class's ``forward``: the norm rules below are that forward's)
SUPPORTED = (nn.Linear, nn.Conv2d, nn.GroupNorm, nn.LayerNorm, nn.Embedding)

#: modules that hand their children's weights to a functional kernel instead of calling the children
#: (``F.multi_head_attention_forward`` takes ``out_proj.weight``): the children's own forward never runs
FUNCTIONAL_PARENTS = (nn.MultiheadAttention,)

#: ``batched_loss(model, *chunk) -> [B]``: every example's loss from ONE batched forward of ``model``
BatchedLoss = Callable[..., Tensor]


class GhostUnsupported(ValueError):
    """Ghost clipping would get this model's clipped sum wrong (a one-line message naming the module). ``vmap_ok``:
    whether per-example gradients from vmap are right there (they differentiate each example's own loss through the
    real forward, so they are wherever no module mixes examples): ``clipping: auto`` falls back to them only then."""

    def __init__(self, reason: str, *, vmap_ok: bool = True) -> None:
        super().__init__(f"ghost clipping: {reason}" + ("; use dpsgd.clipping: vmap" if vmap_ok else ""))
        self.reason, self.vmap_ok = reason, vmap_ok


def batch_mixing_modules(model: nn.Module) -> list[str]:
    """The modules (path, type, why) through which one example's loss depends on the batch's other examples, or the
    model keeps statistics of the batch. No engine here has a per-example gradient of such a model: ghost clipping's
    one batched forward mixes the examples, and vmap would normalise over one example's K draws, another model."""
    out = []
    for name, m in model.named_modules():
        kind = f"{name or 'the model'} ({type(m).__name__})"
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and (m.training or m.running_mean is None):
            # without running statistics a BatchNorm uses the batch's even in eval mode (torch's bn_training)
            out.append(f"{kind} normalises with the statistics of the whole batch")
        elif isinstance(m, nn.modules.batchnorm._NormBase) and m.training and m.track_running_stats:
            out.append(f"{kind} writes the batch's running statistics into the model")
    return out


def _supported_base(module: nn.Module) -> type[nn.Module] | None:
    return next((t for t in SUPPORTED if isinstance(module, t)), None)


def _why_unsupported(module: nn.Module) -> str | None:
    """Why this module's own parameters cannot be handled here (None: they can)."""
    base = _supported_base(module)
    if base is None:
        return type(module).__name__
    if type(module).forward is not base.forward:  # the norm rule is the base forward's; another one is untested
        return f"{type(module).__name__} overrides {base.__name__}.forward"
    if isinstance(module, nn.Conv2d):
        if module.groups != 1:
            return "grouped convolution"
        if module.padding_mode != "zeros" or isinstance(module.padding, str):
            return f"padding {module.padding!r} ({module.padding_mode})"
    if isinstance(module, nn.Embedding) and (module.max_norm is not None or module.scale_grad_by_freq
                                             or module.sparse):
        return "embedding with max_norm, scale_grad_by_freq or sparse gradients"
    return None


def _functional_parent(name: str, parents: dict[str, nn.Module]) -> str | None:
    """Why the module at path ``name`` never runs its own forward: it sits inside one of ``parents``."""
    for path, parent in parents.items():
        if name != path and (not path or name.startswith(path + ".")):
            return f"its weights are used by {path or 'the model'} ({type(parent).__name__}), not by its own forward"
    return None


def unsupported_parameters(model: nn.Module) -> list[str]:
    """Names of trainable parameters ghost clipping cannot handle (with the reason); empty when it can."""
    parents = {n: m for n, m in model.named_modules() if isinstance(m, FUNCTIONAL_PARENTS)}
    owner: dict[int, str] = {}
    out = []
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            name = f"{mname}.{pname}" if mname else pname
            why = _why_unsupported(module) or _functional_parent(mname, parents)
            if why is None and id(p) in owner:  # a tied weight: its gradient is the sum over both modules' uses
                why = f"the same tensor as {owner[id(p)]}"
            owner.setdefault(id(p), name)
            if why is not None:
                out.append(f"{name} ({why})")
    return out


def ghost_is_cheaper(tokens: int, d_in: int, d_out: int) -> bool:
    """Bu et al. 2023 Sec. 3.2: the ghost norm costs ~T^2 (p + d), instantiation ~T p d (and p d memory)."""
    return tokens * (d_in + d_out) < d_in * d_out


@dataclass
class _Call:
    """One call of a layer in the forward, as its hook saw it."""

    saved: Tensor  # what the book-keeping needs from the input (detached): the input itself, x_hat, or the indices
    output: Tensor
    versions: tuple[int, int]  # the saved input's and the output's version counters at the call
    input_node: Node | None  # the input's grad_fn: the call's own part of the graph ends there


@dataclass
class _Layer:
    module: nn.Module
    calls: list[_Call] = field(default_factory=list)


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


def _kind(name: str, module: nn.Module) -> str:
    return f"{name or 'the model'} ({type(module).__name__})"


def _refuse_statically(model: nn.Module) -> None:
    """What the modules alone show: a module mixing examples (vmap no better), or a parameter not handled here."""
    if mixing := batch_mixing_modules(model):
        raise GhostUnsupported(mixing[0], vmap_ok=False)
    if bad := unsupported_parameters(model):
        raise GhostUnsupported(f"cannot handle {bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}")


def _capture(model: nn.Module, batched_loss: BatchedLoss, chunk: Sequence[Tensor]
             ) -> tuple[dict[str, _Layer], Tensor]:
    """The losses ``[B]`` from one forward, and every call of every trainable supported layer in it."""
    layers: dict[str, _Layer] = {}

    def hook(name: str) -> Callable[..., None]:
        def capture(module: nn.Module, args: tuple[Tensor, ...], kwargs: dict[str, Tensor], output: Tensor) -> None:
            if not torch.is_grad_enabled():
                return
            x = args[0] if args else next(iter(kwargs.values()))
            saved = _saved_input(module, x)
            layers.setdefault(name, _Layer(module)).calls.append(
                _Call(saved, output, (saved._version, output._version), x.grad_fn))
        return capture

    handles = [module.register_forward_hook(hook(name), with_kwargs=True) for name, module in model.named_modules()
               if isinstance(module, SUPPORTED) and _trainable(module)]
    try:
        losses = batched_loss(model, *chunk)
    finally:
        for h in handles:
            h.remove()
    return layers, losses


def _check_unmodified(layers: dict[str, _Layer]) -> None:
    """Refuses a captured input or output modified in place later in the forward: torch.autograd.grad follows the
    tensor object, so the gradient would be taken at its later value, and the saved input would be its later value."""
    for name, layer in layers.items():
        for call in layer.calls:
            if call.output._version != call.versions[1]:
                raise GhostUnsupported(f"the output of {_kind(name, layer.module)} is modified in place later in "
                                       "the forward")
            if call.saved._version != call.versions[0]:
                # autograd refuses it as well wherever the weight's gradient is formed (vmap): no route to fall back to
                raise GhostUnsupported(f"the input of {_kind(name, layer.module)} is modified in place later in "
                                       "the forward", vmap_ok=False)


def _call_nodes(calls: list[_Call]) -> set[Node]:
    """The autograd nodes the layer's own calls made: from each output's grad_fn back to (not into) ITS input's (a
    call's input may be the output of the layer's previous call, whose nodes are then still the layer's own)."""
    seen: set[Node] = set()
    for call in calls:
        stack = [call.output.grad_fn] if call.output.grad_fn is not None else []
        while stack:
            node = stack.pop()
            if node in seen or node is call.input_node:
                continue
            seen.add(node)
            stack.extend(f for f, _ in node.next_functions if f is not None and not hasattr(f, "variable"))
    return seen


def _leaf_uses(root: Node) -> Iterator[tuple[Node, Tensor]]:
    """Every (node, leaf tensor) edge of the graph below ``root``: each place a leaf, such as a parameter, is used."""
    seen, stack = {root}, [root]
    while stack:
        node = stack.pop()
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            leaf = getattr(nxt, "variable", None)  # an AccumulateGrad node: the leaf it accumulates into
            if leaf is not None:
                yield node, leaf
            elif nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)


def _check_parameter_uses(model: nn.Module, layers: dict[str, _Layer], losses: Tensor) -> None:
    """Refuses a trainable parameter the losses' graph uses outside a captured call of its own module: a weight tied
    into a later ``F.linear``, or handed to a functional kernel by a parent. The book-keeping sees only the calls'
    inputs and output gradients, so such a use's share of the gradient (and of its norm) would be lost."""
    if losses.grad_fn is None:
        return
    owner = {id(p): (mname, f"{mname}.{pname}" if mname else pname) for mname, m in model.named_modules()
             for pname, p in m.named_parameters(recurse=False) if p.requires_grad}
    inside = {name: _call_nodes(layer.calls) for name, layer in layers.items()}
    outside: dict[int, str] = {}  # parameter -> the first node found using it outside
    for node, leaf in _leaf_uses(losses.grad_fn):
        if id(leaf) in owner and node not in inside.get(owner[id(leaf)][0], ()):
            outside.setdefault(id(leaf), node.name())
    if outside:  # named in the model's order, whatever order the graph was walked in
        key = next(k for k in owner if k in outside)
        mname, pname = owner[key]
        more = f" and {len(outside) - 1} more" if len(outside) > 1 else ""
        raise GhostUnsupported(f"parameter {pname} is used outside the forward of "
                               f"{_kind(mname, model.get_submodule(mname))} (by {outside[key]}){more}")


#: loss owner -> model -> the layouts whose rows the probe has verified (weak keys: dropped with the loss or model)
_VERIFIED: WeakKeyDictionary[object, WeakKeyDictionary[nn.Module, set[Hashable]]] = WeakKeyDictionary()


def _verified_layouts(model: nn.Module, batched_loss: BatchedLoss) -> set[Hashable] | None:
    """The layouts already verified for this model and loss (None: the loss cannot be remembered; probe every call)."""
    owner = getattr(batched_loss, "__self__", batched_loss)
    try:
        per_model = _VERIFIED.setdefault(owner, WeakKeyDictionary())
    except TypeError:
        return None
    return per_model.setdefault(model, set())


def _layout(model: nn.Module, batched_loss: BatchedLoss, calls: list[tuple[str, _Call]], B: int) -> Hashable:
    """What decides which rows of each call belong to which example: the code and the shapes per example. A
    batch-first layout's key does not depend on B, so a run probes once, not at every new micro-batch size."""
    return (getattr(batched_loss, "__func__", batched_loss), model.training,
            tuple((name, divmod(c.saved.shape[0], B), tuple(c.saved.shape[1:])) for name, c in calls))


def _probe_weights(B: int, like: Tensor) -> Tensor:
    """The probe's weight of each example's loss: 2^-3 ... 2^4, cycling, so any two examples fewer than eight apart
    differ by a factor of two at least. Scaling by a power of two is exact in floating point (barring overflow and
    underflow) and a backward pass is linear in its output gradient, so where every row is its example's alone the
    probe's gradient is the plain one times the row's example's weight to the last bit."""
    return torch.pow(2.0, torch.arange(B, device=like.device) % 8 - 3.0).to(like.dtype)


def _rows_follow_examples(g: Tensor, probe: Tensor | None, weights: Tensor) -> bool:
    """Whether a call's output gradients ``g`` (rows example-major, K per example) scale with the rows' examples.

    Exact on CPU (measured: 0 on every backbone here); the tolerance leaves room for GPU kernels that accumulate in a
    nondeterministic order, far below the factor of two a row of another example is off by."""
    if probe is None:
        return not bool(g.any())
    w = weights.repeat_interleave(g.shape[0] // weights.shape[0]).reshape(-1, *(1,) * (g.ndim - 1))
    expected = (g * w).double()
    tol = max(1e-5, 32 * torch.finfo(g.dtype).eps)
    return bool((probe.double() - expected).norm() <= tol * expected.norm())


def _observed_calls(layers: dict[str, _Layer], losses: Tensor, B: int, layout: Hashable,
                    verified: set[Hashable] | None) -> dict[str, list[tuple[Tensor, Tensor]]]:
    """Each layer's calls that reached the loss, as (saved input, output gradient) pairs, from ONE backward to the
    layers' outputs; with a probe first where this layout has not been verified (:func:`_probe_weights`)."""
    calls = [(name, c) for name, layer in layers.items() for c in layer.calls]
    outputs = [c.output for _, c in calls]
    if not outputs:
        return {}
    probing = B > 1 and (verified is None or layout not in verified)
    weights = _probe_weights(B, losses)
    probe = (torch.autograd.grad(losses, outputs, grad_outputs=weights, retain_graph=True, allow_unused=True)
             if probing else (None,) * len(outputs))
    grads = torch.autograd.grad(losses.sum(), outputs, allow_unused=True)
    out: dict[str, list[tuple[Tensor, Tensor]]] = {}
    for (name, call), g, g_probe in zip(calls, grads, probe):
        if g is None:  # this call's output did not reach the loss
            continue
        kind, rows = _kind(name, layers[name].module), call.saved.shape[0]
        if rows % B or g.shape[0] != rows:
            raise GhostUnsupported(f"{kind} saw {rows} rows, not a multiple of the {B} examples")
        if probing and not _rows_follow_examples(g, g_probe, weights):
            raise GhostUnsupported(f"the rows {kind} sees are not the examples', K consecutive per example "
                                   "(a sequence-first input, or examples mixed)")
        out.setdefault(name, []).append((call.saved, g.detach()))
    if probing and verified is not None:
        verified.add(layout)
    return out


def ghost_clip_and_sum(model: nn.Module, batched_loss: BatchedLoss, chunk: Sequence[Tensor], max_grad_norm: float
                       ) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """The clipped sum ``{name: sum_i clip_C(g_i)}`` over the trainable parameters, the per-example norms ``[B]``
    BEFORE clipping and the losses ``[B]``: what ``clip_and_sum(per_example_gradients(...))`` gives, without
    per-example gradients (one forward, one backward to the layers' outputs; see the module docstring).

    ``batched_loss(model, *chunk)`` returns each example's loss ``[B]`` (B = ``len(chunk[0])``); every layer
    must see ``B * K`` rows, K consecutive per example. Raises :class:`GhostUnsupported` where the module docstring's
    preconditions fail, before anything is summed.
    """
    _refuse_statically(model)
    B = int(chunk[0].shape[0])
    layers, losses = _capture(model, batched_loss, chunk)
    if losses.shape != (B,):
        raise ValueError(f"ghost clipping: the batched loss must be one value per example, shape [{B}], "
                         f"got {list(losses.shape)}")
    _check_unmodified(layers)
    _check_parameter_uses(model, layers, losses)
    layout = _layout(model, batched_loss, [(n, c) for n, layer in layers.items() for c in layer.calls], B)
    observed = _observed_calls(layers, losses, B, layout, _verified_layouts(model, batched_loss))
    finishes: list[tuple[str, Finish]] = []
    sq = torch.zeros(B, dtype=losses.dtype, device=losses.device)
    for name in list(observed):
        layer_sq, finish = _book(layers[name].module, observed.pop(name), B)
        sq = sq + layer_sq.to(sq.dtype)
        finishes.append((name, finish))
        layers[name].calls.clear()
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
