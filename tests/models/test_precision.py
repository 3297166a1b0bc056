"""Mixed precision (config ``precision``): bfloat16 forward passes for public training and sampling, float32 state,
never in DP-SGD, and nothing moves at fp32."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pipeline.models.edm import EDMPrecond
from pipeline.models.precision import autocast, in_precision, precision_of, refuse_in_private_training
from pipeline.models.unet import build_unet
from pipeline.stage import PipelineError
from pipeline.training.pretrain import edm_step
from tests.training.test_accumulate import TINY, _batch


def test_fp32_is_no_context_and_bf16_runs_the_matmuls_in_bfloat16():
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with autocast("cpu", "fp32"):
        assert layer(x).dtype == torch.float32
    with autocast("cpu", "bf16"):
        assert layer(x).dtype == torch.bfloat16
    assert in_precision(layer, "cpu", "fp32") is layer
    out = in_precision(layer, "cpu", "bf16")(x)
    assert out.dtype == torch.float32 and not torch.equal(out, layer(x))  # rounded through bfloat16
    torch.testing.assert_close(out, layer(x), rtol=2e-2, atol=2e-2)


def test_an_unknown_precision_stops_in_one_line():
    with pytest.raises(PipelineError, match=r"^pretrain_public: param precision must be one of fp32, bf16, got 'fp16'"):
        precision_of({"precision": "fp16"}, "pretrain_public")
    assert precision_of({}, "s") == "fp32"


def test_dp_sgd_refuses_mixed_precision():
    refuse_in_private_training({}, "train_dpdm")
    refuse_in_private_training({"precision": "fp32"}, "train_dpdm")
    with pytest.raises(PipelineError, match=r"^train_dpdm: DP-SGD runs in float32 only"):
        refuse_in_private_training({"precision": "bf16"}, "train_dpdm")


def _steps(precision: str) -> tuple[list[float], EDMPrecond]:
    torch.manual_seed(0)
    model = EDMPrecond(build_unet(TINY), sigma_data=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, sigma, noise, y = _batch(8)
    losses = [edm_step(model, opt, x, sigma, noise, (y,), sigma_data=0.5, micro_batch=3, precision=precision)
              for _ in range(3)]
    return losses, model


def test_a_bf16_pretraining_step_keeps_float32_weights_and_the_float32_loss_within_bfloat16_rounding():
    fp32, model32 = _steps("fp32")
    bf16, model16 = _steps("bf16")
    assert all(p.dtype == torch.float32 for p in model16.parameters())
    assert all(p.grad.dtype == torch.float32 for p in model16.parameters())
    assert bf16 != fp32  # autocast was on
    for a, b in zip(bf16, fp32):
        assert a == pytest.approx(b, rel=5e-2)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_only_public_training_and_sampling_are_given_a_precision(tmp_path, precision):
    """The wiring hands ``precision`` to the public pretraining and sampling stages when the config asks for bf16, to no
    DP-SGD stage ever, and to none at all at fp32 (so no config id moves)."""
    from pipeline.methods.dpdm.wiring import Wiring as Dpdm
    from pipeline.methods.straightdp.wiring import Wiring as Straightdp
    from tests.methods import house as tour_house

    house = tour_house(tmp_path, lambda cfg: cfg.update(precision=precision))
    dpdm, straightdp = Dpdm(house), Straightdp(house)
    bf16 = precision == "bf16"
    assert house.precision == ({"precision": "bf16"} if bf16 else {})
    dpdm_run = dpdm.runs()[0].name
    sampler = next(iter(house.config["dpdm"]["sampling"]["samplers"]))
    flow_row = next(r.name for r in straightdp.runs() if r.samples_from == "model")
    public = [straightdp.pretrain_params(), dpdm.sample_params(SimpleNamespace(run=dpdm_run, sampler=sampler)),
              straightdp.sample_params(SimpleNamespace(run=flow_row))]
    assert all(('"precision"' in p) == bf16 for p in public)
    # a release's own samples run no network
    released = next(r.name for r in straightdp.runs() if r.samples_from == "release")
    assert '"precision"' not in straightdp.sample_params(SimpleNamespace(run=released))
    straight_run = straightdp.runs()[0].name
    private = [dpdm.train_params(SimpleNamespace(run=dpdm_run)),
               straightdp.private_run_params(SimpleNamespace(run=straight_run), train=True)]
    assert not any('"precision"' in p for p in private)
