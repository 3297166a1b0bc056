"""Public pretraining and Stage 1 distillation: the 2-D toy control, the distillation mix, resume."""

import pytest
import torch

from pipeline.flow.backbone import MLPVelocity
from pipeline.flow.field import GaussianMomentModel
from pipeline.flow.rectified import euler_sample
from pipeline.flow.train import distill_to_field, field_targets, pretrain_flow
from tests.conftest import one_thread

MEANS = torch.tensor([[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]])
STDS = torch.tensor([0.3, 0.5, 0.4])


def toy_mixture(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The 2-D Gaussian mixture of the toy control (STRAIGHTDP Fig. 6): 3 isotropic classes."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    return MEANS[y] + STDS[y, None] * torch.randn(n, 2, generator=g), y


def test_toy_control_a_tiny_flow_learns_a_2d_gaussian_mixture():
    with one_thread():
        z, y = toy_mixture(3000, 0)
        torch.manual_seed(0)
        net = MLPVelocity(2, num_classes=3, hidden=64, depth=2)
        res = pretrain_flow(net, z, y, steps=400, batch_size=256, lr=3e-3, ema_decay=0.99, p_uncond=0.1,
                            generator=torch.Generator().manual_seed(1), progress=False)
        assert res.steps == 400 and len(res.losses) == 400
        assert sum(res.losses[-50:]) / 50 < 0.6 * sum(res.losses[:10]) / 10
        g = torch.Generator().manual_seed(2)
        labels = torch.arange(1500) % 3
        x = euler_sample(res.ema, x0=torch.randn(1500, 2, generator=g), steps=25, y=labels, guidance=1.0,
                         null_label=3)
        for k in range(3):
            s = x[labels == k]
            assert torch.allclose(s.mean(0), MEANS[k], atol=0.2), (k, s.mean(0))
            assert float(s.std(0).mean()) == pytest.approx(float(STDS[k]), rel=0.35), (k, s.std(0))
        # the null branch samples the mixture: its mean and covariance
        u = euler_sample(res.ema, x0=torch.randn(1500, 2, generator=g), steps=25, y=labels, guidance=0.0,
                         null_label=3)
        assert torch.allclose(u.mean(0), z.mean(0), atol=0.3)
        assert torch.allclose(torch.cov(u.T), torch.cov(z.T), atol=0.4)


def toy_field() -> GaussianMomentModel:
    z, y = toy_mixture(3000, 3)
    return GaussianMomentModel.fit(z.double(), y, rank=1, floor=0.1)


def test_field_targets_draw_from_the_release_and_distil_the_null_branch_too():
    field = toy_field()
    g = torch.Generator().manual_seed(4)
    x, t, y, target = field_targets(field, n=4000, tau=0.3, p_uncond=0.25, null_label=3, generator=g)
    assert bool((t >= 0).all()) and bool((t < 0.3).all())
    null = y == 3
    assert 0.2 < float(null.double().mean()) < 0.3
    assert torch.allclose(target[null], field.velocity(x[null], t[null]))
    assert torch.allclose(target[~null], field.velocity(x[~null], t[~null], y[~null]))
    counts = torch.bincount(y[~null], minlength=3).double()
    assert torch.allclose(counts / counts.sum(), field.pi, atol=0.03)


class Spy(torch.nn.Module):
    """Records the (t, y) of every row a step feeds it; velocity = a learnable constant."""

    null_label = 3

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(2))
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x, t, y):
        self.calls.append((t.detach().clone(), y.detach().clone()))
        return self.bias.expand_as(x)


def test_distillation_mix_field_rows_below_tau_replay_rows_above():
    field = toy_field()
    images, labels = toy_mixture(500, 5)
    spy = Spy()
    distill_to_field(spy, field, tau=0.35, steps=3, batch_size=40, lr=1e-3, replay=(images, None),
                     generator=torch.Generator().manual_seed(6), distill_fraction=0.25, progress=False)
    assert len(spy.calls) == 6  # per step: one distillation call (10 rows), one replay call (30 rows)
    for (t_d, y_d), (t_r, y_r) in zip(spy.calls[::2], spy.calls[1::2]):
        assert len(t_d) == 10 and bool((t_d < 0.35).all())
        assert len(t_r) == 30 and bool((t_r >= 0.35).all()) and bool((y_r == 3).all())  # unlabelled replay: null
    with pytest.raises(ValueError, match="without public replay needs distill_fraction=1"):
        distill_to_field(spy, field, tau=0.3, steps=1, batch_size=4, lr=1e-3, replay=None,
                         generator=torch.Generator(), progress=False)
    with pytest.raises(ValueError, match="d=2 coordinates but the images are"):
        distill_to_field(spy, field, tau=0.3, steps=1, batch_size=4, lr=1e-3, replay=(torch.zeros(5, 3), None),
                         generator=torch.Generator(), progress=False)


def test_distillation_brings_the_network_onto_the_analytic_field():
    with one_thread():
        field = toy_field()
        torch.manual_seed(7)
        net = MLPVelocity(2, num_classes=3, hidden=64, depth=2)
        gen = torch.Generator().manual_seed(8)
        probe = field_targets(field, n=2000, tau=0.3, p_uncond=0.1, null_label=3, generator=gen)

        def error(model):
            x, t, y, target = probe
            with torch.no_grad():
                return float((model(x.float(), t.float(), y) - target.float()).pow(2).mean())

        before = error(net)
        res = distill_to_field(net, field, tau=0.3, steps=300, batch_size=128, lr=3e-3, replay=None, generator=gen,
                               distill_fraction=1.0, ema_decay=0.9, progress=False)
        assert error(res.ema) < 0.05 * before


def test_pretraining_resumes_to_the_same_weights(tmp_path):
    with one_thread():
        z, y = toy_mixture(300, 9)

        def run(steps, state):
            torch.manual_seed(0)
            net = MLPVelocity(2, num_classes=3, hidden=16, depth=1)
            return pretrain_flow(net, z, y, steps=steps, batch_size=32, lr=1e-2, ema_decay=0.9, p_uncond=0.2,
                                 generator=torch.Generator().manual_seed(1), progress=False,
                                 state_path=state, run_hash="toy")

        straight = run(20, None)
        run(10, tmp_path / "state.pt")  # a run that stopped at step 10 and left its state
        resumed = run(20, tmp_path / "state.pt")
        assert resumed.resumed_from == 10
        for a, b in zip(straight.ema.state_dict().values(), resumed.ema.state_dict().values()):
            assert torch.equal(a, b)
        with pytest.raises(ValueError, match="needs run_hash"):
            pretrain_flow(MLPVelocity(2), z, None, steps=1, batch_size=4, lr=1e-3, ema_decay=0.9, p_uncond=0.0,
                          generator=torch.Generator(), progress=False, state_path=tmp_path / "x.pt")


def _weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("stage", ["pretrain", "distill"])
def test_a_batch_reached_by_micro_batches_trains_the_one_pass_weights_and_one_micro_batch_is_the_one_pass_bit_for_bit(
        stage):
    field = toy_field()
    images, labels = toy_mixture(200, 7)
    out = {}
    for micro in (None, 40, 7):
        torch.manual_seed(0)
        model = MLPVelocity(2, num_classes=3)
        gen = torch.Generator().manual_seed(8)
        if stage == "pretrain":
            res = pretrain_flow(model, images, labels, steps=2, batch_size=40, lr=1e-3, ema_decay=0.0, p_uncond=0.2,
                                generator=gen, progress=False, micro_batch=micro)
        else:
            res = distill_to_field(model, field, tau=0.35, steps=2, batch_size=40, lr=1e-3, replay=(images, labels),
                                   generator=gen, distill_fraction=0.25, progress=False, micro_batch=micro)
        # the last step's gradient stays in .grad (Adam would hide a wrongly scaled one in the weights)
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        out[micro] = (_weights(model), res.losses, grads)
    assert torch.equal(out[40][0], out[None][0])  # a micro-batch of the whole batch: the one-pass step itself
    torch.testing.assert_close(out[7][2], out[None][2], rtol=1e-4, atol=1e-7)  # 6 micro-batches of <= 7
    torch.testing.assert_close(out[7][0], out[None][0], rtol=1e-4, atol=1e-6)
    assert out[7][1] == pytest.approx(out[None][1], rel=1e-5)
