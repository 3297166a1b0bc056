"""The release DP-HP, DP-NTK and DP-MEPF share (pipeline/privacy/mean_embedding.py): rows of norm <= 1,
sensitivity 2/m by brute force over replace-one neighbours with each method's own feature map, the noise it
adds, its certified eps against dp_accounting and the closed form, its ledger line and its replay (the
one-run audit: tests/audit/test_baseline_canaries.py). Each privacy check comes with the mutation it must
catch (a halved sensitivity, the noise switched off, an edited event, a row of norm > 1)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.baselines import features as feat
from pipeline.privacy import accountants as acc
from pipeline.privacy import ledger, rebuild
from pipeline.privacy import mean_embedding as me
from pipeline.privacy.dp_merf import embedding_sensitivity, mean_embedding
from pipeline.privacy.replay import ReplayError, audit

COARSE = acc.PLDSettings(1e-3)


def maps(dim: int, seed: int = 0) -> dict[str, object]:
    """Each successor's feature map at a tiny size (DP-MEPF's normalisation over a stand-in public tower)."""
    g = torch.Generator().manual_seed(seed)
    public = torch.rand((40, dim), generator=g, dtype=torch.float64)
    hp = feat.hermite_features(public, {"order": 6, "prod_order": 2, "n_pairs": 3, "alpha": 0.5}, g)
    ntk = feat.NTKFeatures(dim, 8, g)
    tower = torch.randn((dim, 5), generator=g, dtype=torch.float64)

    def mepf(x: torch.Tensor) -> torch.Tensor:  # PerceptualFeatures' map over a random linear "tower"
        phi = torch.nn.functional.normalize(torch.tanh(x @ tower), dim=1)
        return torch.cat([math.sqrt(0.5) * phi, math.sqrt(0.5) * phi * phi], dim=1)
    return {"dp_hp": hp, "dp_ntk": ntk, "dp_mepf": mepf}


def brute_force_sensitivity(phi_of, x, y, candidates, cand_labels, n_classes):
    """max over every record i and every replacement c of ||mu(D) - mu(D with x_i := c)||_F."""
    base = mean_embedding(phi_of(x), y, n_classes)
    worst = 0.0
    for i in range(len(x)):
        for c, yc in zip(candidates, cand_labels):
            x2, y2 = x.clone(), y.clone()
            x2[i], y2[i] = c, yc
            worst = max(worst, float((mean_embedding(phi_of(x2), y2, n_classes) - base).norm()))
    return worst


@pytest.mark.parametrize("method", ["dp_hp", "dp_ntk", "dp_mepf"])
@settings(max_examples=8, deadline=None)
@given(st.integers(2, 6), st.integers(0, 10_000))
def test_the_declared_sensitivity_bounds_every_replace_one_neighbour(method, m, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand((m, 4), generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (m,), generator=g)
    cands = torch.rand((5, 4), generator=g, dtype=torch.float64) * 3 - 1  # also outside [0, 1]
    phi_of = maps(4, seed)[method]
    assert float(phi_of(torch.cat([x, cands])).norm(dim=1).max()) <= 1 + 1e-12
    assert brute_force_sensitivity(phi_of, x, y, cands, torch.arange(5) % 3, 3) <= embedding_sensitivity(m) + 1e-12


def test_a_halved_sensitivity_is_caught_by_the_brute_force():
    """DP-NTK's rows have norm exactly 1: a replacement that changes the label moves mu by sqrt(2)/m > 1/m."""
    m = 4
    g = torch.Generator().manual_seed(3)
    x, y = torch.rand((m, 4), generator=g, dtype=torch.float64), torch.zeros(m, dtype=torch.long)
    worst = brute_force_sensitivity(maps(4)["dp_ntk"], x, y, torch.rand((2, 4), generator=g, dtype=torch.float64),
                                    torch.tensor([1, 2]), 3)
    assert worst == pytest.approx(math.sqrt(2) / m, rel=1e-9)
    assert worst > embedding_sensitivity(m) / 2


def plan(sigma=2.0, m=50, F=16, Y=3, mechanism="dp_hp_embedding"):
    return me.EmbeddingReleasePlan(mechanism=mechanism, sigma=sigma, m=m, feature_dim=F, n_classes=Y, delta=1e-5)


def test_the_release_adds_gaussian_noise_of_std_sigma_times_two_over_m_over_batches():
    p = plan(sigma=2.0, m=50, F=500, Y=4)
    phi = torch.nn.functional.normalize(torch.randn((50, 500), generator=torch.Generator().manual_seed(0),
                                                   dtype=torch.float64), dim=1)
    y = torch.arange(50) % 4
    noisy = me.release([(phi[:20], y[:20]), (phi[20:], y[20:])], p, generator=torch.Generator().manual_seed(1))
    noise = noisy - mean_embedding(phi, y, 4)
    assert float(noise.std()) == pytest.approx(2.0 * 2 / 50, rel=0.05)  # 2000 entries
    assert abs(float(noise.mean())) < 4 * p.noise_std / math.sqrt(noise.numel())
    # the noise switched off (or sigma -> 0) fails the first assertion; this one says so
    assert float(noise.std()) > 0.5 * p.noise_std


def test_the_release_refuses_a_row_of_norm_above_one_and_a_wrong_count():
    p = plan(m=4, F=2)
    with pytest.raises(me.EmbeddingError, match="norm <= 1"):
        me.release([(torch.full((4, 2), 0.8, dtype=torch.float64), torch.zeros(4, dtype=torch.long))], p,
                   generator=torch.Generator())
    with pytest.raises(me.EmbeddingError, match="summed 3 private rows"):
        me.release([(torch.full((3, 2), 0.5, dtype=torch.float64), torch.zeros(3, dtype=torch.long))], p,
                   generator=torch.Generator())


def test_calibration_meets_the_target_and_matches_dp_accountings_pld_and_the_closed_form():
    p = me.calibrate_release("dp_ntk_embedding", target_epsilon=1.0, delta=1e-5, m=100, feature_dim=8, n_classes=2,
                             settings=COARSE)
    eps = p.epsilon(COARSE)
    assert 0.99 < eps <= 1.0
    pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    pld.compose(dp_event.GaussianDpEvent(p.sigma))
    assert pld.get_epsilon(1e-5) <= 1.0 + 1e-9
    exact = acc.gdp_epsilon(1e-5, 1 / p.sigma)  # one Gaussian is exactly (1/sigma)-GDP
    assert exact * (1 - 1e-9) <= eps <= exact * 1.01


@pytest.mark.parametrize("mechanism", sorted(me.MECHANISMS))
def test_each_line_replays_and_an_edited_sigma_or_claim_is_refused(tmp_path, mechanism):
    p = me.calibrate_release(mechanism, target_epsilon=3.0, delta=1e-5, m=100, feature_dim=8, n_classes=2,
                             settings=COARSE)
    entry = me.ledger_entry(p, stage=mechanism.split("_embedding")[0], config_id="t", seed=0, settings=COARSE)
    assert entry.adjacency == "replace_one" and entry.sensitivity == pytest.approx(0.02)
    assert entry.noise_std == pytest.approx(p.sigma * 0.02)
    path = tmp_path / "l.jsonl"
    ledger.append_entry(path, entry)
    results, _ = audit({"run": path}, {"run": 1})
    assert results[0]["ok"] and results[0]["recomputed_epsilon"] <= 3.0
    weaker = dataclasses.replace(entry, event=ledger.event_to_dict(dp_event.GaussianDpEvent(2 * p.sigma)),
                                 noise_std=2 * p.noise_std, noise_multiplier=2 * p.sigma)
    with pytest.raises(rebuild.RebuildError):
        rebuild.check(weaker)
    # a line declaring half the sensitivity at the same noise (so twice the multiplier, consistently)
    halved = dataclasses.replace(entry, sensitivity=entry.sensitivity / 2, noise_multiplier=2 * p.sigma,
                                 event=ledger.event_to_dict(dp_event.GaussianDpEvent(2 * p.sigma)))
    with pytest.raises(rebuild.RebuildError):
        rebuild.check(halved)
    bad = tmp_path / "bad.jsonl"
    ledger.append_entry(bad, dataclasses.replace(entry, claimed_epsilon=entry.claimed_epsilon / 2))
    with pytest.raises(ReplayError, match="claimed eps"):
        audit({"run": bad}, {"run": 1})


@pytest.mark.parametrize("bad", [{"sigma": 0.0}, {"m": 0}, {"feature_dim": 0}, {"delta": 1.0},
                                 {"mechanism": "dp_merf_embedding"}])
def test_bad_plans_are_one_line_errors(bad):
    args = {"mechanism": "dp_hp_embedding", "sigma": 1.0, "m": 10, "feature_dim": 4, "n_classes": 2, "delta": 1e-5,
            **bad}
    with pytest.raises(me.EmbeddingError):
        me.EmbeddingReleasePlan(**args)
