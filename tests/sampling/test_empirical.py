"""EMPDEN samplers: full batch, Algorithm 1 (output-wise subsampled hybrid), per-step resampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.privacy.replay import replay_transcripts
from pipeline.privacy import accountants as acc
from pipeline.privacy import empirical_denoiser as emp
from pipeline.privacy import ledger
from pipeline.privacy.schedule import EDMSchedule, block_mu, k_private_steps, step_mu
from pipeline.sampling import empirical as empden

COARSE_PLD = acc.PLDSettings(1e-3, -50.0)  # test speed only (the coarsest the replay accepts); the paper's settings are the default


@pytest.fixture
def data() -> torch.Tensor:
    return torch.rand(40, 1, 4, 4, generator=torch.Generator().manual_seed(0)) * 2 - 1


@pytest.fixture
def sink(tmp_path) -> emp.LedgerSink:
    return emp.LedgerSink(path=tmp_path / "ledger" / "sample.jsonl", stage="sample_test", config_id="test", seed=0,
                          delta=1e-5, pld=COARSE_PLD)


class RecordingDenoiser:
    """A public denoiser that always answers z and remembers the noise levels it was asked at."""

    def __init__(self, z: torch.Tensor):
        self.z, self.sigmas = z, []

    def __call__(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        self.sigmas.append(sigma)
        return self.z.expand_as(x)


def test_renoising_gives_the_marginal_variance_t1_squared():
    """x0 + t0 eps re-noised to t1 has variance t1^2 around x0 (Algorithm 1, line 8)."""
    gen = torch.Generator().manual_seed(1)
    x0 = torch.full((200_000,), 0.3, dtype=torch.float64)
    t0, t1 = 0.7, 2.5
    x = empden.renoise(x0 + t0 * torch.randn(x0.shape, generator=gen, dtype=torch.float64), t0, t1, generator=gen)
    # std of a 2e5-sample variance estimate: sqrt(2/2e5) ~ 0.3%
    assert (x - x0).var().item() == pytest.approx(t1**2, rel=0.02)
    assert (x - x0).mean().item() == pytest.approx(0.0, abs=0.02)
    with pytest.raises(ValueError, match="t1 >= t0"):
        empden.renoise(x0, 2.0, 1.0)


def test_hybrid_hands_off_at_t1_and_the_public_denoiser_finishes_at_t0(data, sink):
    """k = ceil(pN/100) private steps end at t0 = t_k; the public denoiser starts at t1 = t_{k-T} and reaches 0."""
    schedule = EDMSchedule(N=39)
    z = torch.full((1, 1, 4, 4), 0.25)
    public = RecordingDenoiser(z)
    out = empden.sample_hybrid(data, n_out=3, B=8, p_percent=55, T=3, public_denoiser=public, C=1.0, beta=1.0,
                               sink=sink, generator=torch.Generator().manual_seed(2), schedule=schedule)
    k, t0, t1 = empden.hybrid_times(schedule, 55, 3)
    t = schedule.times()
    assert k == k_private_steps(39, 55) and t0 == t[k] and t1 == t[k - 3]
    assert max(public.sigmas) == pytest.approx(t1) and min(public.sigmas) > 0
    # Heun with D = z ends exactly at z (the last Euler step to t = 0 lands on D)
    torch.testing.assert_close(out, z.expand(3, 1, 4, 4))


def test_outputwise_sampler_draws_each_outputs_subset_once(data, sink, monkeypatch):
    calls = []
    real = emp.draw_subsets

    def counting(n, B, n_out, **kw):
        calls.append(n_out)
        return real(n, B, n_out, **kw)

    monkeypatch.setattr(emp, "draw_subsets", counting)
    used = []
    real_step = emp.private_step

    def recording_step(x, data, t, t_next, **kw):
        used.append(kw["subset"])
        return real_step(x, data, t, t_next, **kw)

    monkeypatch.setattr(emp, "private_step", recording_step)
    kw = dict(B=5, p_percent=50, T=0, public_denoiser=RecordingDenoiser(torch.zeros(1)), C=1.0, beta=1.0,
              sink=sink, generator=torch.Generator().manual_seed(3), batch_size=4)
    empden.sample_hybrid(data, n_out=10, **kw)
    assert calls == [4, 4, 2], "one subset per output, drawn once for the whole private block"
    k = k_private_steps(39, 50)
    for chunk in range(3):  # every private step of a chunk averages over that chunk's one subset
        steps = used[chunk * k:(chunk + 1) * k]
        assert all(s is steps[0] for s in steps) and steps[0].shape == (calls[chunk], 5)
    used.clear()
    calls.clear()
    empden.sample_hybrid(data, n_out=4, resample="per_step", **kw)
    assert calls == [4] * k, "per-step resampling draws a fresh subset at every private step"
    assert len({id(s) for s in used}) == k


def test_every_call_writes_one_replayable_ledger_line(data, sink):
    gen = torch.Generator().manual_seed(4)
    public = RecordingDenoiser(torch.zeros(1))
    full = EDMSchedule(N=10)
    empden.sample_full_batch(data, n_out=2, C=0.5, beta=1.0, sink=sink, generator=gen, schedule=full)
    empden.sample_hybrid(data, n_out=3, B=8, p_percent=55, T=2, public_denoiser=public, C=0.5, beta=1.0, sink=sink,
                         generator=gen)
    empden.sample_hybrid(data, n_out=3, B=8, p_percent=55, T=2, public_denoiser=public, C=0.5, beta=1.0, sink=sink,
                         generator=gen, resample="per_step")
    lines = [e for _, e in ledger.read_ledger(sink.path)]
    assert [e.mechanism for e in lines] == ["empden_full_batch", "empden_outputwise_block",
                                            "empden_per_step_subsampled"]
    assert [e.count for e in lines] == [2, 3, 3]

    # what the lines claim is what the schedule says (eq. 39, eq. 9), not something else
    mu_full = np.sqrt(2 * np.sum(step_mu(full, C=0.5, beta=1.0, batch_size=40)[:9] ** 2))
    assert acc.gdp_mu_of_event(lines[0].dp_event()) == pytest.approx(mu_full, rel=1e-12)
    k = k_private_steps(39, 55)
    mu_bar = block_mu(step_mu(EDMSchedule(N=39), C=0.5, beta=1.0, batch_size=8), k)
    assert lines[1].dp_event() == acc.outputwise_event(mu_bar, 8 / 40, 3)
    assert lines[1].sensitivity == emp.sensitivity(C=0.5, beta=1.0, subset_size=8)

    results = replay_transcripts([sink.path])
    assert len(results) == 3 and all(r["ok"] for r in results)


def test_full_batch_stops_at_sigma_min_and_is_reproducible(data, tmp_path):
    def run(seed_path):
        s = emp.LedgerSink(path=seed_path, stage="t", config_id="t", seed=0, delta=1e-5)
        return empden.sample_full_batch(data, n_out=2, C=1.0, beta=1.0, sink=s, schedule=EDMSchedule(N=8),
                                        generator=torch.Generator().manual_seed(5))
    a, b = run(tmp_path / "a.jsonl"), run(tmp_path / "b.jsonl")
    assert a.shape == (2, 1, 4, 4) and torch.isfinite(a).all()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    (entry,) = [e for _, e in ledger.read_ledger(tmp_path / "a.jsonl")]
    assert entry.extra["k_steps"] == 7 and entry.extra["t_end"] == pytest.approx(0.002)


def test_a_private_block_covering_the_whole_grid_is_refused(data, sink):
    with pytest.raises(ValueError, match="covers all 39 steps"):
        empden.sample_hybrid(data, n_out=1, B=4, p_percent=100, T=0, public_denoiser=RecordingDenoiser(torch.zeros(1)),
                             C=1.0, beta=1.0, sink=sink, generator=torch.Generator())
    assert not sink.path.exists(), "nothing ran, so nothing is claimed"
    with pytest.raises(ValueError, match="subsample size B"):
        empden.sample_hybrid(data, n_out=1, B=41, p_percent=50, T=0, public_denoiser=RecordingDenoiser(torch.zeros(1)),
                             C=1.0, beta=1.0, sink=sink, generator=torch.Generator())
    assert not sink.path.exists()


def test_an_edm_preconditioned_unet_is_a_public_denoiser(data, sink):
    """The public part takes any D(x, sigma); here the project's EDMPrecond around a tiny UNet2DModel."""
    from diffusers import UNet2DModel

    from pipeline.models.edm import EDMPrecond

    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=4, in_channels=1, out_channels=1, block_out_channels=(8, 16), layers_per_block=1,
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
                       norm_num_groups=4)
    net = EDMPrecond(unet).eval()
    out = empden.sample_hybrid(data, n_out=2, B=8, p_percent=62, T=2, public_denoiser=net, C=1.0, beta=1.0,
                               sink=sink, generator=torch.Generator().manual_seed(6), schedule=EDMSchedule(N=12))
    assert out.shape == (2, 1, 4, 4) and out.dtype == torch.float32 and torch.isfinite(out).all()
    assert not out.requires_grad, "sampling builds no autograd graph"


def test_public_normaliser_changes_the_samples_but_not_the_claim(data, tmp_path):
    """public_data switches eq. 38's constant normaliser to Z = p_hat_pub(x_t): other samples, the same ledger claim.

    Z reads only public records and the released state, so sensitivity, noise and eps are those
    of the constant normaliser; only the ledger's extra.normaliser names the choice.
    """
    public = torch.rand(25, 1, 4, 4, generator=torch.Generator().manual_seed(9)) * 2 - 1
    out, lines = {}, {}
    for name, pub in (("constant", None), ("public_marginal", public)):
        s = emp.LedgerSink(path=tmp_path / f"{name}.jsonl", stage="t", config_id="t", seed=0, delta=1e-5,
                           pld=COARSE_PLD)
        out[name] = empden.sample_hybrid(data, n_out=3, B=8, p_percent=55, T=2,
                                         public_denoiser=RecordingDenoiser(torch.zeros(1)), C=0.5, beta=1.0, sink=s,
                                         generator=torch.Generator().manual_seed(7), public_data=pub)
        (lines[name],) = [e for _, e in ledger.read_ledger(s.path)]
    assert not torch.equal(out["constant"], out["public_marginal"])
    a, b = lines["constant"], lines["public_marginal"]
    assert (a.extra["normaliser"], b.extra["normaliser"]) == ("constant", "public_marginal")
    assert a.claimed_epsilon == b.claimed_epsilon and a.sensitivity == b.sensitivity and a.noise_std == b.noise_std
    assert a.dp_event() == b.dp_event()


def test_every_private_step_divides_by_the_public_marginal_at_its_own_state(data, sink, monkeypatch):
    public = torch.rand(25, 1, 4, 4, generator=torch.Generator().manual_seed(9)) * 2 - 1
    pub = emp.prepare_records(public)
    seen = []
    real_step = emp.private_step

    def checking_step(x, prep, t, t_next, **kw):
        torch.testing.assert_close(kw["log_normaliser"], emp.log_public_marginal(x, pub, t), rtol=0, atol=0)
        seen.append(t)
        return real_step(x, prep, t, t_next, **kw)

    monkeypatch.setattr(emp, "private_step", checking_step)
    schedule = EDMSchedule(N=8)
    empden.sample_full_batch(data, n_out=2, C=1.0, beta=1.0, sink=sink, generator=torch.Generator().manual_seed(8),
                             schedule=schedule, public_data=public)
    assert seen == pytest.approx(list(schedule.times()[:7]))


def test_public_records_of_another_dimension_are_refused(data, sink):
    with pytest.raises(ValueError, match="public normaliser records have dimension 9"):
        empden.sample_full_batch(data, n_out=1, C=1.0, beta=1.0, sink=sink, generator=torch.Generator(),
                                 schedule=EDMSchedule(N=4), public_data=torch.zeros(3, 1, 3, 3))
    assert not sink.path.exists(), "nothing ran, so nothing is claimed"
