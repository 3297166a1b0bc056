"""Ghost clipping's guard (pipeline/privacy/ghost.py, issue 54 item 5): ghost clipping assumes every trainable parameter
enters the loss through its own module's forward, with the batch's examples in rows and no module mixing them. Each
model here breaks one assumption. Under ``clipping: ghost`` it is refused in one line naming the module; under
``auto`` (the default) it is refused where no route has a per-example gradient (a BatchNorm on the batch's
statistics), and elsewhere gets vmap's clipped sum, never ghost's wrong one.

On the code before the guard (e41ffe2) ``auto`` took ghost for all four of the issue's models and its clipped sum
(every example clipped, B = 4, K = 2, float64) was off vmap's by 110% (the BatchNorm), 18% (the sequence-first
Linear), 45% (MultiheadAttention: out_proj's gradient exactly zero) and 38% (the tied embedding)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.privacy import dpsgd, ghost
from pipeline.privacy.ghost import GhostUnsupported, ghost_clip_and_sum, unsupported_parameters
from tests.conftest import one_thread

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # vmap over attention

WIDTH = 8  # each example is a vector of 8 numbers


class BatchNormNet(nn.Module):
    """A parameter-free BatchNorm between two Linears: in train mode it normalises over the whole batch."""

    def __init__(self, **bn: bool) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.bn = nn.BatchNorm1d(WIDTH, **({"affine": False, "track_running_stats": False} | bn))

    def forward(self, x, sigma):
        return self.out(torch.tanh(self.bn(self.inp(x))))


class SequenceFirstNet(nn.Module):
    """Each row is T = 4 tokens of width 2; the middle Linear sees them sequence-first, ``[T, rows, d]``."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.mid, self.out = nn.Linear(2, 3), nn.Linear(3, 3), nn.Linear(3, 2)

    def forward(self, x, sigma):
        h = torch.tanh(self.inp(x.reshape(x.shape[0], 4, 2)))
        h = torch.tanh(self.mid(h.transpose(0, 1))).transpose(0, 1)
        return self.out(h).reshape(x.shape)


class AttentionNet(nn.Module):
    """nn.MultiheadAttention with its input projection frozen: inside it only out_proj, a Linear, trains, and
    F.multi_head_attention_forward uses out_proj.weight without calling out_proj."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(2, 4), nn.Linear(4, 2)
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)
        self.attn.in_proj_weight.requires_grad_(False)
        self.attn.in_proj_bias.requires_grad_(False)

    def forward(self, x, sigma):
        h = torch.tanh(self.inp(x.reshape(x.shape[0], 4, 2)))
        h, _ = self.attn(h, h, h, need_weights=False)
        return self.out(h).reshape(x.shape)


class TiedEmbeddingNet(nn.Module):
    """The label's Embedding, its weight tied into the output projection by F.linear (weight tying)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.emb = nn.Linear(WIDTH, 6), nn.Embedding(WIDTH, 6)

    def forward(self, x, sigma, y):
        return F.linear(torch.tanh(self.inp(x) + self.emb(y)), self.emb.weight)


class ChildWeightNet(nn.Module):
    """A parent that uses its child Linear's weight in its own F.linear, the child never called: what
    MultiheadAttention does, in a module no list of known layers names."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.proj = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x, sigma):
        return F.linear(torch.tanh(self.inp(x)), self.proj.weight, self.proj.bias)


class SharedWeightNet(nn.Module):
    """One Parameter registered in two Linears: its gradient is the sum of both uses."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.b.weight = self.a.weight

    def forward(self, x, sigma):
        return self.b(torch.tanh(self.a(x)))


class InputChangedNet(nn.Module):
    """A Linear's input modified in place after the Linear ran: the saved input is no longer what it multiplied."""

    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, sigma):
        h = x * 1.0
        out = self.b(h)
        h.mul_(2.0)
        return out + h


class PlainNet(nn.Module):
    """Two Linears on the batch's rows, as ghost clipping assumes."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.proj = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x, sigma):
        return self.proj(torch.tanh(self.inp(x)))


class ChainedNet(nn.Module):
    """One Linear applied to its own output: both calls are its own forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, sigma):
        return self.lin(self.lin(x))


def draw_loss(model_fn, x, sigma, noise, *cond):
    return (model_fn(x + sigma[:, None] * noise, sigma, *cond) - x).pow(2).sum(1)


LOSS = dpsgd.multiplicity_loss(draw_loss)
PLAN = dpsgd.DPSGDPlan(noise_multiplier=1.0, max_grad_norm=1.0, sampling_rate=0.5, dataset_size=8, steps=2, delta=1e-5)


def chunk(B: int, K: int = 2, *, labels: bool = False, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """A micro-batch as the engine hands it over: B examples, their K (sigma, noise) draws, and maybe labels."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, WIDTH, generator=g, dtype=torch.float64)
    sigma = torch.rand(B, K, generator=g, dtype=torch.float64) + 0.5
    noise = torch.randn(B, K, WIDTH, generator=g, dtype=torch.float64)
    return (x, sigma, noise) + ((torch.randint(0, WIDTH, (B,), generator=g),) if labels else ())


def build(cls: type[nn.Module], **kw: bool) -> nn.Module:
    torch.manual_seed(0)
    return cls(**kw).double()


def vmap_clipped_sum(model: nn.Module, batch: tuple[torch.Tensor, ...], C: float) -> dict[str, torch.Tensor]:
    grads, _ = dpsgd.per_example_gradients(model, LOSS, batch)
    return dpsgd.clip_and_sum(grads, C)[0]


def engine(model: nn.Module, clipping: str) -> dpsgd.DPSGD:
    return dpsgd.DPSGD(model, LOSS, PLAN, clipping=clipping)


def engine_clipped_sum(e: dpsgd.DPSGD, batch: tuple[torch.Tensor, ...], C: float) -> dict[str, torch.Tensor]:
    with one_thread():
        return e.clipped_sum(batch, C, dpsgd.trainable_parameters(e.model))[0]


def assert_same_sums(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(ref)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-10, atol=1e-14)


# --------------------------------------------------------------------------- examples mixed: refused by every route

def test_a_batchnorm_on_the_batchs_statistics_is_refused_under_auto_and_ghost_in_one_line():
    model = build(BatchNormNet)  # no parameters of its own: the old guard never looked at it
    for clipping in ("auto", "ghost"):
        with pytest.raises(dpsgd.DPSGDError, match=rf"^dpsgd clipping {clipping}: module bn \(BatchNorm1d\) normalises "
                                                   r"with the statistics of the whole batch; use GroupNorm or LayerNorm"
                                                   r", or a BatchNorm frozen in eval mode with running statistics$"):
            engine(model, clipping)
    with pytest.raises(GhostUnsupported, match=r"^ghost clipping: bn \(BatchNorm1d\) normalises") as refused:
        ghost_clip_and_sum(model, LOSS.batched, chunk(4), 1.0)
    assert not refused.value.vmap_ok  # so auto has nothing to fall back to
    # in eval mode, without running statistics, torch still normalises with the batch's
    with pytest.raises(dpsgd.DPSGDError, match="normalises with the statistics of the whole batch"):
        engine(build(BatchNormNet).eval(), "auto")


def test_norm_layers_writing_the_batchs_running_statistics_are_refused_too():
    with pytest.raises(dpsgd.DPSGDError, match=r"module bn \(BatchNorm1d\) normalises"):
        engine(build(BatchNormNet, track_running_stats=True), "auto")
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Unflatten(1, (2, 4)),
                          nn.InstanceNorm1d(2, track_running_stats=True), nn.Flatten())
    with pytest.raises(dpsgd.DPSGDError, match=r"^dpsgd clipping auto: module 2 \(InstanceNorm1d\) writes the batch's "
                                               r"running statistics into the model"):
        engine(model, "auto")
    assert engine(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Unflatten(1, (2, 4)), nn.InstanceNorm1d(2),
                                nn.Flatten()), "auto").clipping == "ghost"  # per-example statistics: no mixing


def test_a_batchnorm_frozen_in_eval_mode_mixes_nothing_and_ghost_gives_vmaps_clipped_sum():
    model = build(BatchNormNet, track_running_stats=True)
    model.bn.running_mean.uniform_(-1, 1)
    model.bn.running_var.uniform_(0.5, 2)
    model.bn.eval()
    e = engine(model, "auto")
    assert e.clipping == "ghost"
    batch = chunk(4)
    assert_same_sums(engine_clipped_sum(e, batch, 1e-3), vmap_clipped_sum(model, batch, 1e-3))


def test_a_batchnorm_put_in_train_mode_after_the_engine_was_built_is_refused_at_the_step():
    model = build(BatchNormNet, track_running_stats=True).eval()
    e = engine(model, "auto")
    model.train()
    with pytest.raises(dpsgd.DPSGDError, match=r"^dpsgd clipping auto: bn \(BatchNorm1d\) normalises with the "
                                               r"statistics of the whole batch$"):
        engine_clipped_sum(e, chunk(4), 1.0)


# --------------------------------------------------------------------------- used outside its forward: ghost refuses

#: (model, its micro-batch, what ghost says about it, whether the modules alone show it)
OUTSIDE = {
    "sequence_first": (SequenceFirstNet, {}, r"the rows mid \(Linear\) sees are not the examples', K consecutive per "
                                             r"example \(a sequence-first input, or examples mixed\)", False),
    "attention": (AttentionNet, {}, r"parameter attn\.out_proj\.weight \(its weights are used by attn "
                                    r"\(MultiheadAttention\), not by its own forward\) is of a layer it does not "
                                    r"handle", True),
    "tied_embedding": (TiedEmbeddingNet, {"labels": True}, r"parameter emb\.weight is used outside the forward of emb "
                                                           r"\(Embedding\) \(by TBackward0\)", False),
    "child_weight": (ChildWeightNet, {}, r"parameter proj\.weight is used outside the forward of proj \(Linear\) "
                                           r"\(by TBackward0\) and 1 more",
                     False),
    "shared_weight": (SharedWeightNet, {}, r"parameter b\.weight \(the same tensor as a\.weight\) is of a layer it "
                                           r"does not handle", True),
}


@pytest.mark.parametrize("name", list(OUTSIDE))
def test_ghost_refuses_a_parameter_used_outside_its_modules_forward_in_one_line_naming_it(name):
    cls, kw, says, static = OUTSIDE[name]
    model, batch = build(cls), chunk(4, **kw)
    if static:  # refused when the engine is built
        with pytest.raises(dpsgd.DPSGDError, match=rf"^dpsgd clipping ghost: {says}; use vmap or auto$"):
            engine(model, "ghost")
    else:  # only the forward shows it: refused at the first step, before anything is summed
        e = engine(model, "ghost")
        assert e.clipping == "ghost"
        with pytest.raises(dpsgd.DPSGDError, match=rf"^dpsgd clipping ghost: {says}; use vmap or auto$"):
            engine_clipped_sum(e, batch, 1.0)
        with pytest.raises(GhostUnsupported, match=rf"^ghost clipping: {says}; use dpsgd.clipping: vmap$"):
            ghost_clip_and_sum(model, LOSS.batched, batch, 1.0)


@pytest.mark.parametrize("C", [1e-3, 1e3])  # every example clipped, none
@pytest.mark.parametrize("name", list(OUTSIDE))
def test_under_auto_the_clipped_sum_is_vmaps(name, C):
    cls, kw, _, _ = OUTSIDE[name]
    model, batch = build(cls), chunk(4, **kw)
    e = engine(model, "auto")
    got = engine_clipped_sum(e, batch, C)
    assert e.clipping == "vmap"  # and stays there for the rest of the run
    assert_same_sums(got, vmap_clipped_sum(model, batch, C))
    assert all(g.abs().max() > 0 for g in got.values())  # out_proj's gradient is no longer silently zero


def test_a_sequence_first_linear_is_refused_whatever_the_micro_batch_size():
    """T = 4 tokens: with B = 4 or 2 the rows are a multiple of B and only the probe sees the layout; with B = 3 the
    row count alone does."""
    model = build(SequenceFirstNet)
    with pytest.raises(GhostUnsupported, match=r"the rows mid \(Linear\) sees are not the examples'"):
        ghost_clip_and_sum(model, LOSS.batched, chunk(2), 1.0)
    with pytest.raises(GhostUnsupported, match=r"^ghost clipping: mid \(Linear\) saw 4 rows, not a multiple of the 3 "
                                               r"examples; use dpsgd.clipping: vmap$"):
        ghost_clip_and_sum(model, LOSS.batched, chunk(3), 1.0)
    summed = ghost_clip_and_sum(model, LOSS.batched, chunk(1), 1e-3)[0]  # one example owns every row: right
    assert_same_sums(summed, vmap_clipped_sum(model, chunk(1), 1e-3))


# --------------------------------------------------------------------------- what still runs by ghost

def test_a_batch_first_model_keeps_ghost_and_is_probed_once_per_layout(monkeypatch):
    """The probe (one more backward) runs on the first micro-batch of a layout, not on every one: a batch-first
    layout's key does not depend on the micro-batch size."""
    probed = []
    real = ghost._rows_follow_examples
    monkeypatch.setattr(ghost, "_rows_follow_examples", lambda *a: probed.append(1) or real(*a))
    model = build(PlainNet)
    e = engine(model, "auto")
    assert e.clipping == "ghost"
    # a probe compares two calls (two Linears); one example has nothing to verify
    for B, expected_probes in ((1, 0), (4, 2), (3, 2), (5, 2)):
        batch = chunk(B, seed=B)
        got = engine_clipped_sum(e, batch, 1e-2)
        assert e.clipping == "ghost" and len(probed) == expected_probes
        assert_same_sums(got, vmap_clipped_sum(model, batch, 1e-2))
    other = dpsgd.multiplicity_loss(draw_loss)  # another loss is probed afresh
    ghost_clip_and_sum(model, other.batched, chunk(4), 1.0)
    assert len(probed) == 4


def test_a_layer_applied_to_its_own_output_is_two_uses_inside_its_forward_and_keeps_ghost():
    model, batch = build(ChainedNet), chunk(4)
    e = engine(model, "ghost")
    assert_same_sums(engine_clipped_sum(e, batch, 1e-3), vmap_clipped_sum(model, batch, 1e-3))
    assert e.clipping == "ghost"


def test_a_layers_input_modified_in_place_after_it_ran_is_refused_not_silently_wrong():
    """Before, ghost clipping multiplied the output gradients by the input's later value; vmap's backward (autograd's
    version check) refuses such a forward too, so auto has nothing to fall back to."""
    model = build(InputChangedNet)
    with pytest.raises(GhostUnsupported, match=r"^ghost clipping: the input of b \(Linear\) is modified in place later "
                                               r"in the forward$"):
        ghost_clip_and_sum(model, LOSS.batched, chunk(4), 1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        vmap_clipped_sum(model, chunk(4), 1.0)
    with pytest.raises(dpsgd.DPSGDError, match=r"^dpsgd clipping auto: the input of b \(Linear\) is modified"):
        engine_clipped_sum(engine(model, "auto"), chunk(4), 1.0)


def test_unsupported_parameters_names_each_parameter_and_why():
    assert unsupported_parameters(build(AttentionNet)) == [
        "attn.out_proj.weight (its weights are used by attn (MultiheadAttention), not by its own forward)",
        "attn.out_proj.bias (its weights are used by attn (MultiheadAttention), not by its own forward)"]

    class Overridden(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    assert unsupported_parameters(Overridden(2, 2)) == ["weight (Overridden overrides Linear.forward)",
                                                        "bias (Overridden overrides Linear.forward)"]
