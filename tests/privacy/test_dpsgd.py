"""DP-SGD engine: each test fails when one part of the mechanism is wrong (clip, noise,
normalisation, calibration, sampling rate vs ledger, per-example gradients, noise multiplicity)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from torch import nn

from tests.ledgers import bind, replay_stage
from pipeline.privacy import accountants as acc
from pipeline.privacy import dpsgd, ledger
from pipeline.training.augment import RandomShiftFlip

COARSE = acc.PLDSettings(1e-3)  # fast, and recorded on the ledger line like any other setting


class TinyDenoiser(nn.Module):
    """A two-layer conv denoiser D(x; sigma) on 1x4x4 images, input scaled like EDM's c_in."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Tanh(), nn.Conv2d(4, 1, 3, padding=1))

    def forward(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return self.net(x / torch.sqrt(1 + sigma[:, None, None, None] ** 2))


def draw_loss(model_fn, x, sigma, noise):
    """Per-draw denoising loss ||D(x + sigma n; sigma) - x||^2, shape [K]."""
    return (model_fn(x + sigma[:, None, None, None] * noise, sigma) - x).pow(2).flatten(1).sum(1)


def lognormal_sigma(n, generator):
    return torch.exp(torch.randn(n, generator=generator) * 1.2 - 1.2)


def plan(**overrides) -> dpsgd.DPSGDPlan:
    fields = dict(noise_multiplier=1.0, max_grad_norm=1.0, sampling_rate=0.25, dataset_size=40, steps=10, delta=1e-5)
    fields.update(overrides)
    return dpsgd.DPSGDPlan(**fields)


def images(n: int, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    return scale * torch.randn(n, 1, 4, 4, generator=torch.Generator().manual_seed(seed))


def engine(model, p, K=2, microbatch_size=64, seed=0, clipping="auto") -> dpsgd.DPSGD:
    return dpsgd.DPSGD(model, dpsgd.multiplicity_loss(draw_loss), p, microbatch_size=microbatch_size,
                       multiplicity=dpsgd.NoiseMultiplicity(K, lognormal_sigma),
                       generator=torch.Generator().manual_seed(seed),
                       noise_generator=torch.Generator().manual_seed(seed + 1), clipping=clipping)


def flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads.values()])


# --------------------------------------------------------------------------- per-example gradients

def test_per_example_gradients_equal_a_loop_of_single_example_backward_passes():
    torch.manual_seed(0)
    model = TinyDenoiser()
    x = images(5)
    mult = dpsgd.NoiseMultiplicity(3, lognormal_sigma)
    sigma, noise = mult.draw(x, torch.Generator().manual_seed(1))
    loss_fn = dpsgd.multiplicity_loss(draw_loss)
    grads, losses = dpsgd.per_example_gradients(model, loss_fn, (x, sigma, noise))
    for i in range(5):
        model.zero_grad()
        loss = loss_fn(lambda *inp: model(*inp), x[i], sigma[i], noise[i])
        loss.backward()
        assert losses[i].item() == pytest.approx(loss.item(), rel=1e-5)
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name][i], p.grad, rtol=1e-4, atol=1e-6)


def test_micro_batching_is_invisible_to_the_mechanism():
    # a deterministic loss (fixed sigma, no draws): only the physical chunking differs
    model, p, x = TinyDenoiser(), plan(), images(40)
    loss = lambda f, xi: (f(xi[None], torch.ones(1)) - xi).pow(2).sum()  # noqa: E731
    idx = torch.arange(17)
    run = lambda mb: dpsgd.DPSGD(model, loss, p, microbatch_size=mb,  # noqa: E731
                                 noise_generator=torch.Generator().manual_seed(1)).privatised_gradient((x,), idx)[0]
    g_small, g_big = run(3), run(64)
    torch.testing.assert_close(flat(g_small), flat(g_big), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("route, function", [("vmap", "per_example_gradients"), ("ghost", "ghost_clip_and_sum")])
def test_no_physical_batch_exceeds_the_micro_batch_size(monkeypatch, route, function):
    seen = []
    real = getattr(dpsgd, function)

    def spy(model, loss_fn, batch, *args):
        seen.append(batch[0].shape[0])
        return real(model, loss_fn, batch, *args)

    monkeypatch.setattr(dpsgd, function, spy)
    model, p, x = TinyDenoiser(), plan(), images(40)
    e = engine(model, p, microbatch_size=4, clipping=route)
    _, info = e.privatised_gradient((x,), torch.arange(37))
    assert e.clipping == route and max(seen) <= 4 and sum(seen) == 37 == info.batch_size


# --------------------------------------------------------------------------- clipping

def test_each_clipped_contribution_has_norm_at_most_C_and_small_ones_are_untouched():
    g = {"w": torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])}  # norms 5, 0.5, 0
    for i, expected in enumerate([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]]):
        summed, norms = dpsgd.clip_and_sum({"w": g["w"][i:i + 1]}, max_grad_norm=1.0)
        torch.testing.assert_close(summed["w"], torch.tensor(expected))
    _, norms = dpsgd.clip_and_sum(g, 1.0)
    torch.testing.assert_close(norms, torch.tensor([5.0, 0.5, 0.0]))


def test_the_clip_norm_is_taken_over_all_parameters_together():
    # per-tensor norms 0.8 and 0.6 are each < C = 1, but the example's norm is 1.0 * 2 = 2
    g = {"a": torch.tensor([[1.6]]), "b": torch.tensor([[1.2]])}
    summed, _ = dpsgd.clip_and_sum(g, 1.0)
    assert math.hypot(summed["a"].item(), summed["b"].item()) == pytest.approx(1.0)


def test_privatised_sum_is_bounded_by_batch_size_times_C_for_huge_gradients():
    model, p = TinyDenoiser(), plan(noise_multiplier=0.5)
    x = images(40, scale=1e3)  # per-example gradients ~1e6 >> C
    e = engine(model, p)
    idx = torch.arange(20)
    grads, info = e.privatised_gradient((x,), idx)
    assert info.grad_norms.min() > 100 * p.max_grad_norm  # the test is about clipping
    d = flat(grads).numel()
    released_sum_norm = flat(grads).norm().item() * p.expected_batch_size
    noise_bound = p.noise_std * (math.sqrt(d) + 6)  # chi_d tail, far beyond any realistic draw
    assert released_sum_norm <= len(idx) * p.max_grad_norm + noise_bound


# --------------------------------------------------------------------------- noise and normalisation

@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_noise_std_is_sigma_C_over_qN_around_the_clipped_mean(device):
    # on CUDA (device: auto puts the model, the data and the noise generator there) the release
    # must stay on the GPU, its clipped part must be the CPU's, and its noise the plan's
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 16))  # ~2k coordinates
    model_fn_loss = lambda model_fn, x: (model_fn(x) - x).pow(2).sum()  # noqa: E731
    p = plan(noise_multiplier=1.3, max_grad_norm=0.5, sampling_rate=0.1, dataset_size=200)
    x = torch.randn(200, 16)
    idx = torch.arange(23)
    e = dpsgd.DPSGD(copy.deepcopy(model).to(device), model_fn_loss, p,
                    noise_generator=torch.Generator(device=device).manual_seed(3))
    noisy, info = e.privatised_gradient((x.to(device),), idx)
    assert all(t.device.type == device for t in noisy.values())
    pe, _ = dpsgd.per_example_gradients(model, model_fn_loss, (x[idx],))
    clean, norms = dpsgd.clip_and_sum(pe, p.max_grad_norm)
    torch.testing.assert_close(info.grad_norms.cpu(), norms, rtol=1e-4, atol=1e-6)
    assert info.grad_norms.min() > p.max_grad_norm  # every example is clipped: the test is about C
    residual = flat({k: v.cpu() for k, v in noisy.items()}) - flat(clean) / p.expected_batch_size
    expected = p.noise_multiplier * p.max_grad_norm / (p.sampling_rate * p.dataset_size)
    n = residual.numel()
    # the sample std of n Gaussians is within 5/sqrt(2n) relative of the truth (5 sigma)
    assert residual.std().item() == pytest.approx(expected, rel=5 / math.sqrt(2 * n))
    assert residual.mean().abs().item() < 5 * expected / math.sqrt(n)


def test_an_empty_poisson_batch_releases_pure_noise_and_still_steps():
    model = TinyDenoiser()
    before = torch.cat([q.detach().reshape(-1).clone() for q in model.parameters()])
    p = plan(sampling_rate=1e-9, noise_multiplier=2.0)
    e = engine(model, p)
    info = e.step(torch.optim.SGD(model.parameters(), lr=1.0), (images(40),))
    assert info.batch_size == 0 and info.grad_norms.numel() == 0
    after = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    step = before - after  # lr 1: the step IS the released gradient, pure N(0, (sigma C / qN)^2)
    assert torch.isfinite(step).all() and step.std().item() > 0
    expected = p.noise_std / p.expected_batch_size
    assert step.std().item() == pytest.approx(expected, rel=5 / math.sqrt(2 * step.numel()))


# --------------------------------------------------------------------------- sampling vs ledger

def test_the_sampler_draws_at_the_rate_the_ledger_claims():
    p = plan(sampling_rate=0.05, dataset_size=2000, steps=50)
    entry = dpsgd.ledger_entry(p, stage="train_dpdm", config_id="c", seed=0, settings=COARSE)
    event = entry.dp_event()
    q_ledger = entry.sampling["probability"]
    assert event.event.sampling_probability == q_ledger and entry.sampling["n"] == p.dataset_size
    e = engine(TinyDenoiser(), p)
    sizes = torch.tensor([len(e.sample()) for _ in range(200)], dtype=torch.float64)
    mean_rate = sizes.mean().item() / p.dataset_size
    sd = math.sqrt(q_ledger * (1 - q_ledger) / (p.dataset_size * 200))
    assert abs(mean_rate - q_ledger) < 5 * sd
    assert sizes.var().item() > 0  # Poisson: the batch size varies


def test_a_dataset_of_another_size_than_the_plan_is_refused():
    model, p = TinyDenoiser(), plan()
    with pytest.raises(dpsgd.DPSGDError, match="N=40"):
        engine(model, p).step(torch.optim.SGD(model.parameters(), lr=0.1), (images(41),))


def test_steps_beyond_the_accounted_number_are_refused():
    model, p = TinyDenoiser(), plan(steps=2, sampling_rate=0.1)
    e, opt = engine(model, p), torch.optim.SGD(model.parameters(), lr=0.1)
    e.step(opt, (images(40),))
    e.step(opt, (images(40),))
    with pytest.raises(dpsgd.DPSGDError, match="2 steps"):
        e.step(opt, (images(40),))


# --------------------------------------------------------------------------- calibration and ledger

def test_calibrated_sigma_meets_the_target_and_a_slightly_smaller_one_exceeds_it():
    kw = dict(delta=1e-5, sampling_rate=0.02, steps=50)
    rtol = 1e-2
    sigma = dpsgd.calibrate_noise_multiplier(target_epsilon=2.0, settings=COARSE, rtol=rtol, **kw)
    eps = lambda s: acc.pld_epsilon(dpsgd.dpsgd_event(s, 0.02, 50), 1e-5, settings=COARSE)  # noqa: E731
    assert eps(sigma) <= 2.0
    assert eps(sigma * (1 - 2 * rtol)) > 2.0


def test_an_unreachable_target_is_a_one_line_error():
    with pytest.raises(dpsgd.DPSGDError, match="unreachable"):
        dpsgd.calibrate_noise_multiplier(target_epsilon=1e-4, delta=1e-5, sampling_rate=1.0, steps=100,
                                         settings=COARSE, bracket=(0.2, 5.0))


def test_the_ledger_line_replays(tmp_path):
    p = dpsgd.plan_for_budget(target_epsilon=1.0, delta=1e-5, max_grad_norm=1.0, batch_size=100,
                              dataset_size=10_000, steps=30, settings=COARSE, rtol=1e-2)
    entry = dpsgd.ledger_entry(p, stage="train_dpdm", config_id="c", seed=0, settings=COARSE)
    assert entry.claimed_epsilon <= 1.0
    assert entry.noise_std == p.noise_multiplier * p.max_grad_norm and entry.sensitivity == p.max_grad_norm
    path = tmp_path / "ledger" / "train_dpdm.jsonl"
    ledger.append_entry(path, entry)
    bind(path, run="r")
    report = replay_stage(tmp_path, a=path)
    assert report["all_ok"] and report["claims"][0]["mechanism"] == "dpsgd"


def test_fixed_size_batches_use_the_replace_one_accountant_with_sensitivity_2C():
    p = plan(noise_multiplier=2.0, max_grad_norm=0.5, sampling_rate=0.1, dataset_size=100, steps=5,
             sampling="fixed_size")
    entry = dpsgd.ledger_entry(p, stage="t", config_id="c", seed=0)
    assert entry.adjacency == "replace_one" and entry.sensitivity == 1.0 and entry.noise_multiplier == 1.0
    rdp = rdp_lib.RdpAccountant(neighboring_relation=rdp_lib.NeighborRel.REPLACE_ONE)
    rdp.compose(dp_event.SelfComposedDpEvent(dp_event.SampledWithoutReplacementDpEvent(
        100, 10, dp_event.GaussianDpEvent(1.0)), 5))
    assert entry.claimed_epsilon == pytest.approx(rdp.get_epsilon(1e-5))
    assert len(dpsgd.DPSGD(TinyDenoiser(), lambda f, x: f(x).sum(), p).sample()) == 10


def test_fixed_size_ledger_line_replays_with_replace_one(tmp_path):
    p = plan(noise_multiplier=2.0, max_grad_norm=0.5, sampling_rate=0.1, dataset_size=100, steps=5,
             sampling="fixed_size")
    entry = dpsgd.ledger_entry(p, stage="t", config_id="c", seed=0)
    path = tmp_path / "ledger" / "t.jsonl"
    ledger.append_entry(path, entry)
    bind(path, run="r")
    report = replay_stage(tmp_path, a=path)
    assert report["all_ok"]
    assert report["claims"][0]["recomputed_epsilon"] == pytest.approx(entry.claimed_epsilon)


@pytest.mark.parametrize("bad, match", [(dict(noise_multiplier=0.0), "sigma"), (dict(max_grad_norm=-1.0), "clip"),
                                        (dict(sampling_rate=1.5), "sampling rate"), (dict(steps=0), "steps"),
                                        (dict(sampling="shuffle"), "sampling"),
                                        (dict(sampling="fixed_size", sampling_rate=0.33), "integer")])
def test_bad_plans_are_one_line_errors(bad, match):
    with pytest.raises(dpsgd.DPSGDError, match=match):
        plan(**bad)


# --------------------------------------------------------------------------- noise multiplicity

def test_K1_and_K32_have_the_same_norm_bound_and_the_same_ledger_line():
    model, p, x = TinyDenoiser(), plan(max_grad_norm=0.1), images(40, scale=3.0)
    lines = []
    for K in (1, 32):
        grads, info = engine(model, p, K=K).privatised_gradient((x,), torch.arange(8))
        pe, _ = dpsgd.per_example_gradients(model, dpsgd.multiplicity_loss(draw_loss),
                                            (x[:8], *dpsgd.NoiseMultiplicity(K, lognormal_sigma).draw(x[:8])))
        for i in range(8):
            clipped, _ = dpsgd.clip_and_sum({k: v[i:i + 1] for k, v in pe.items()}, p.max_grad_norm)
            assert flat(clipped).norm().item() <= p.max_grad_norm * (1 + 1e-5)
        entry = json.loads(dpsgd.ledger_entry(p, stage="train_dpdm", config_id="c", seed=0, settings=COARSE).to_json())
        entry.pop("time_utc")
        lines.append(entry)
    assert lines[0] == lines[1]


def test_the_loss_variance_falls_as_1_over_K():
    torch.manual_seed(0)
    model = TinyDenoiser()
    x = images(1).expand(4000, 1, 4, 4)  # one example, many independent draws of its loss
    var = {}
    for K in (1, 16):
        sigma, noise = dpsgd.NoiseMultiplicity(K, lognormal_sigma).draw(x, torch.Generator().manual_seed(K))
        _, losses = dpsgd.per_example_gradients(model, dpsgd.multiplicity_loss(draw_loss), (x, sigma, noise))
        var[K] = losses.var().item()
    # DPDM Theorem 1: Var = Var_1 / K; a loose band because the loss is heavy-tailed
    assert 16 / 2 < var[1] / var[16] < 16 * 2


# --------------------------------------------------------------------------- per-step plans (StepPlan)

class AlternatingPlan:
    """A StepPlan whose clip and noise std alternate between two values (even / odd steps)."""

    sampling, sampling_rate, dataset_size, steps = "poisson", 0.25, 40, 4
    expected_batch_size = batch_size = 10

    def clip_at(self, step):
        return (0.1, 3.0)[step % 2]

    def noise_std_at(self, step):
        return (0.5, 2.0)[step % 2]

    def bucket_of(self, step):
        return step % 2

    def time_range_at(self, step):
        return None


def test_a_dpsgd_plan_is_a_step_plan_with_constant_clip_noise_and_no_time_range():
    p = plan(noise_multiplier=1.3, max_grad_norm=0.5)
    assert isinstance(p, dpsgd.StepPlan) and isinstance(AlternatingPlan(), dpsgd.StepPlan)
    for step in (0, 7):
        assert p.clip_at(step) == 0.5 and p.noise_std_at(step) == p.noise_std and p.bucket_of(step) == 0
        assert p.time_range_at(step) is None
    _, info = engine(TinyDenoiser(), p).privatised_gradient((images(40),), torch.arange(5))
    assert info.bucket == 0 and info.clip == 0.5


@pytest.mark.parametrize("route", ["vmap", "ghost"])
def test_the_dpsgd_plan_releases_bit_for_bit_what_the_mechanism_defines(route):
    # pins DPDM's numbers: draws, per-example clip at C, one N(0, (sigma C)^2) draw per coordinate, / qN; bit for
    # bit by per-example gradients, to float rounding by ghost clipping (other sums of the same products)
    model, p, x = TinyDenoiser(), plan(noise_multiplier=1.3, max_grad_norm=0.2), images(40)
    idx = torch.arange(12)
    got, _ = engine(model, p, K=2, seed=5, clipping=route).privatised_gradient((x,), idx)
    mult, gen = dpsgd.NoiseMultiplicity(2, lognormal_sigma), torch.Generator().manual_seed(5)
    sigma, noise = mult.draw(x[idx], gen)
    pe, _ = dpsgd.per_example_gradients(model, dpsgd.multiplicity_loss(draw_loss), (x[idx], sigma, noise))
    summed, _ = dpsgd.clip_and_sum(pe, 0.2)
    ngen = torch.Generator().manual_seed(6)
    for k, t in summed.items():
        t.add_(torch.randn(t.shape, generator=ngen), alpha=1.3 * 0.2).div_(p.expected_batch_size)
        if route == "vmap":
            assert torch.equal(got[k], t)
        else:
            torch.testing.assert_close(got[k], t, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------- augmentation multiplicity


def augmented_engine(model, p, K, seed=0, clipping="auto", max_shift=1) -> dpsgd.DPSGD:
    mult = dpsgd.NoiseMultiplicity(K, lognormal_sigma, augment=RandomShiftFlip(max_shift=max_shift, flip=True))
    return dpsgd.DPSGD(model, dpsgd.multiplicity_loss(draw_loss), p, microbatch_size=5, multiplicity=mult,
                       generator=torch.Generator().manual_seed(seed),
                       noise_generator=torch.Generator().manual_seed(seed + 1), clipping=clipping)


@pytest.mark.parametrize("route", ["vmap", "ghost"])
def test_augmentation_multiplicity_trains_each_draw_on_its_own_view_clipped_per_example(route):
    # DP-Diffusion's augmentation multiplicity: example i's loss averages K draws, draw k on view k of x_i, BEFORE the clip at C: the
    # released sum is sum_i clip(grad l_i) + N(0, (sigma C)^2), the same mechanism as without augmentation
    model, p, x = TinyDenoiser(), plan(noise_multiplier=1.3, max_grad_norm=0.2), images(40, scale=3.0)
    idx = torch.arange(12)
    got, info = augmented_engine(model, p, K=3, seed=5, clipping=route).privatised_gradient((x,), idx)
    aug, gen = RandomShiftFlip(max_shift=1, flip=True), torch.Generator().manual_seed(5)
    mult = dpsgd.NoiseMultiplicity(3, lognormal_sigma)
    want = {k: torch.zeros_like(v) for k, v in got.items()}
    for start in range(0, 12, 5):  # the engine's micro-batches draw sigma, noise, then the views, in turn
        xb = x[idx[start:start + 5]]
        sigma, noise = mult.draw(xb, gen)
        views = aug.apply(xb, aug.draw(len(xb), 3, gen))
        for i in range(len(xb)):  # one example at a time: its gradient over its own views only
            model.zero_grad()
            dpsgd.multiplicity_loss(draw_loss)(lambda a, s: model(a, s), views[i], sigma[i], noise[i]).backward()
            g = {k: prm.grad.detach().clone() for k, prm in model.named_parameters()}
            norm = flat(g).norm()
            assert info.grad_norms[start + i].item() == pytest.approx(norm.item(), rel=1e-4)
            for k in want:
                want[k] += g[k] * min(1.0, 0.2 / norm.item())
    ngen = torch.Generator().manual_seed(6)
    for k, t in want.items():
        t.add_(torch.randn(t.shape, generator=ngen), alpha=1.3 * 0.2).div_(p.expected_batch_size)
        torch.testing.assert_close(got[k], t, rtol=1e-4, atol=1e-6)


def test_augmented_views_change_the_gradient_and_each_contribution_still_has_norm_at_most_C():
    model, p, x = TinyDenoiser(), plan(max_grad_norm=0.05), images(40, scale=3.0)
    plain, _ = engine(model, p, K=2, seed=3).privatised_gradient((x,), torch.arange(10))
    aug, info = augmented_engine(model, p, K=2, seed=3, max_shift=2).privatised_gradient((x,), torch.arange(10))
    assert not torch.allclose(flat(plain), flat(aug))  # the views are used (the draws of sigma and noise are shared)
    noiseless = augmented_engine(model, plan(max_grad_norm=0.05, noise_multiplier=1e-12), K=2, seed=3, max_shift=2)
    for i in range(10):  # the noiseless released sum of one example is its clipped contribution
        g, _ = noiseless.privatised_gradient((x,), torch.tensor([i]))
        assert flat(g).norm().item() * p.expected_batch_size <= 0.05 * (1 + 1e-5)


def test_an_example_contributes_the_same_whatever_the_other_examples_are():
    # a view is a function of its own example: replacing example 1 moves no other example's gradient norm
    model, p, x = TinyDenoiser(), plan(), images(40, scale=3.0)
    y = x.clone()
    y[1] = images(1, scale=3.0, seed=9)[0]
    _, a = augmented_engine(model, p, K=2, seed=4).privatised_gradient((x,), torch.arange(6))
    _, b = augmented_engine(model, p, K=2, seed=4).privatised_gradient((y,), torch.arange(6))
    keep = torch.tensor([0, 2, 3, 4, 5])
    torch.testing.assert_close(a.grad_norms[keep], b.grad_norms[keep])
    assert a.grad_norms[1] != b.grad_norms[1]


def test_draw_without_a_time_range_calls_the_two_argument_sampler_unchanged():
    calls = []

    def two_args(n, generator):  # every existing sampler has this signature
        calls.append(n)
        return lognormal_sigma(n, generator)

    x = images(3)
    sigma, _ = dpsgd.NoiseMultiplicity(2, two_args).draw(x, torch.Generator().manual_seed(0))
    ref = lognormal_sigma(6, torch.Generator().manual_seed(0)).reshape(3, 2)
    assert calls == [6] and torch.equal(sigma, ref)


def test_draw_with_a_time_range_passes_it_and_refuses_draws_outside():
    seen = []

    def ranged(n, generator, time_range):
        seen.append(time_range)
        lo, hi = time_range
        return lo + (hi - lo) * 0.5 * torch.ones(n)

    sigma, _ = dpsgd.NoiseMultiplicity(3, ranged).draw(images(2), None, (0.2, 0.4))
    assert seen == [(0.2, 0.4)] and torch.allclose(sigma, torch.full((2, 3), 0.3))
    outside = dpsgd.NoiseMultiplicity(3, lambda n, g, r: torch.full((n,), r[1]))  # hi itself: outside [lo, hi)
    with pytest.raises(dpsgd.DPSGDError, match="time draws"):
        outside.draw(images(2), None, (0.2, 0.4))


def test_the_engine_reads_clip_and_noise_of_the_current_step(monkeypatch):
    clips = []
    real = dpsgd.clip_and_sum

    def spy(grads, max_grad_norm):
        clips.append(max_grad_norm)
        return real(grads, max_grad_norm)

    monkeypatch.setattr(dpsgd, "clip_and_sum", spy)
    p = AlternatingPlan()
    model = nn.Linear(64, 64)
    zero_loss = lambda f, x: 0.0 * f(x).sum()  # noqa: E731  (released gradient = noise / qN)
    e = dpsgd.DPSGD(model, zero_loss, p, noise_generator=torch.Generator().manual_seed(0))
    x = torch.randn(40, 64)
    n = 64 * 64 + 64
    for step in range(4):
        e.steps_taken = step
        grads, info = e.privatised_gradient((x,), torch.arange(8))
        assert clips[-1] == p.clip_at(step) == info.clip and info.bucket == step % 2
        measured = flat(grads).std().item()
        assert measured == pytest.approx(p.noise_std_at(step) / 10, rel=5 / math.sqrt(2 * n))
        # the check would catch the other step's (smaller or larger) noise
        assert measured != pytest.approx(p.noise_std_at(step + 1) / 10, rel=5 / math.sqrt(2 * n))


def test_gradient_norm_quantiles_per_bucket_are_the_medians_over_steps():
    """STRAIGHTDP App. D.3's log: per step p50/p90 and clip fraction; per bucket their medians and p90/p50."""
    from pipeline.privacy.dpsgd import StepInfo, norm_quantiles, summarise_norm_quantiles

    def info(norms, bucket, clip=2.0):
        t = torch.tensor(norms, dtype=torch.float64)
        return StepInfo(batch_size=len(norms), grad_norms=t, losses=torch.zeros(len(norms)), bucket=bucket, clip=clip)

    row = norm_quantiles(info([float(i) for i in range(1, 12)], 0))  # 1..11
    assert row == {"bucket": 0, "p50": 6.0, "p90": 10.0, "clip_fraction": 9 / 11, "n": 11}
    assert norm_quantiles(info([], 1)) is None  # an empty Poisson batch
    rows = [row, None, norm_quantiles(info([1.0, 1.0, 1.0], 0)), norm_quantiles(info([1.0, 3.0], 1))]
    rows.append(norm_quantiles(info([2.0, 2.0], 0)))
    out = summarise_norm_quantiles(rows)
    assert set(out) == {"0", "1"} and out["0"]["steps"] == 3 and out["1"]["steps"] == 1
    assert out["0"]["p50"] == 2.0 and out["0"]["p90"] == 2.0 and out["0"]["p90_over_p50"] == 1.0
    assert out["1"]["p50"] == pytest.approx(2.0) and out["1"]["p90"] == pytest.approx(2.8)
    assert out["1"]["clip_fraction"] == 0.5
