"""A denoiser file rebuilds the same function it was written from, or fails with one line."""

import pytest
import torch

from pipeline.models.checkpoint import load_denoiser, read_denoiser_meta, save_denoiser
from pipeline.models.edm import EDMPrecond
from pipeline.models.unet import UNetSpec, build_unet
from pipeline.stage import PipelineError


def test_round_trip_gives_the_same_denoiser(tmp_path):
    spec = UNetSpec(num_classes=10)
    torch.manual_seed(0)
    model = EDMPrecond(build_unet(spec), sigma_data=0.5).eval()
    save_denoiser(tmp_path / "d.pt", model, unet=spec, precond="edm", precond_kwargs={"sigma_data": 0.5},
                  meta={"stage": "test"})
    loaded = load_denoiser(tmp_path / "d.pt")
    x, labels = torch.randn(3, 1, 16, 16), torch.tensor([0, 4, 10])
    with torch.no_grad():
        assert torch.equal(model(x, 0.7, labels), loaded(x, 0.7, labels))
    assert read_denoiser_meta(tmp_path / "d.pt") == {"stage": "test"}
    assert not loaded.training


def test_unet_spec_json_round_trip_and_errors():
    spec = UNetSpec(block_out_channels=(32, 64, 64), attention=(False, True, True), image_size=32)
    assert UNetSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="one entry per resolution level"):
        UNetSpec(attention=(True,))
    with pytest.raises(ValueError, match="unknown key 'widht'"):
        UNetSpec.from_json({"widht": 3})


def test_missing_or_foreign_file_is_one_line(tmp_path):
    with pytest.raises(PipelineError, match="no denoiser file"):
        load_denoiser(tmp_path / "nope.pt")
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(PipelineError, match="not a dpgen-denoiser/1 file"):
        load_denoiser(tmp_path / "other.pt")


# --------------------------------------------------------------------------- conventions

from pipeline.models import checkpoint  # noqa: E402
from pipeline.models.denoiser import CONVENTIONS, Preconditioned  # noqa: E402
from pipeline.models.precond import PRECONDITIONERS  # noqa: E402

SMALL = UNetSpec(image_size=8, block_out_channels=(8, 16), norm_num_groups=4)


class StraightVelocity(torch.nn.Module):
    """A rectified-flow velocity model v(x, t) = F(x; t): no preconditioning, t in [0, 1]."""

    convention = "rectified_flow_t"

    def __init__(self, unet: torch.nn.Module, t_scale: float = 1000.0) -> None:
        super().__init__()
        self.unet, self.t_scale = unet, float(t_scale)

    def forward(self, x, t, class_labels=None):
        t = torch.as_tensor(t, dtype=x.dtype).expand(x.shape[0])
        return self.unet(x, t * self.t_scale, class_labels=class_labels).sample


@pytest.fixture
def flow_registered(monkeypatch):
    monkeypatch.setitem(checkpoint.DENOISERS, "straight_velocity", StraightVelocity)
    return "straight_velocity"


@pytest.mark.parametrize("name", sorted(PRECONDITIONERS))
def test_every_preconditioner_is_stored_as_ve_sigma_and_loads_to_the_same_function(tmp_path, name):
    torch.manual_seed(0)
    net = PRECONDITIONERS[name](build_unet(SMALL)).eval()
    assert isinstance(net, Preconditioned)
    save_denoiser(tmp_path / "d.pt", net, unet=SMALL, precond=name)
    assert checkpoint.read_denoiser_convention(tmp_path / "d.pt") == "ve_sigma"
    loaded = load_denoiser(tmp_path / "d.pt", convention="ve_sigma")
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(loaded(x, 0.3), net(x, 0.3))


def test_a_flow_model_is_saved_and_loaded_through_the_same_module(tmp_path, flow_registered):
    torch.manual_seed(0)
    net = StraightVelocity(build_unet(SMALL), t_scale=500.0).eval()
    save_denoiser(tmp_path / "flow.pt", net, unet=SMALL, precond=flow_registered, precond_kwargs={"t_scale": 500.0})
    assert torch.load(tmp_path / "flow.pt", weights_only=True)["convention"] == "rectified_flow_t"
    loaded = load_denoiser(tmp_path / "flow.pt", convention="rectified_flow_t")
    assert isinstance(loaded, StraightVelocity) and loaded.t_scale == 500.0
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(loaded(x, 0.25), net(x, 0.25))
    # a VE-sigma sampler refuses it with one line instead of reading t as sigma
    with pytest.raises(PipelineError, match="holds a rectified_flow_t model .* this needs ve_sigma"):
        load_denoiser(tmp_path / "flow.pt", convention="ve_sigma")


def test_a_file_from_before_conventions_loads_as_ve_sigma(tmp_path):
    torch.manual_seed(0)
    net = EDMPrecond(build_unet(SMALL)).eval()
    save_denoiser(tmp_path / "d.pt", net, unet=SMALL, precond="edm")
    blob = torch.load(tmp_path / "d.pt", weights_only=True)
    del blob["convention"]  # what every file written before this key existed looks like
    torch.save(blob, tmp_path / "old.pt")
    assert checkpoint.read_denoiser_convention(tmp_path / "old.pt") == "ve_sigma"
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(load_denoiser(tmp_path / "old.pt", convention="ve_sigma")(x, 0.3), net(x, 0.3))


def test_a_file_whose_convention_disagrees_with_its_class_is_refused(tmp_path):
    net = EDMPrecond(build_unet(SMALL))
    save_denoiser(tmp_path / "d.pt", net, unet=SMALL, precond="edm")
    blob = torch.load(tmp_path / "d.pt", weights_only=True)
    torch.save({**blob, "convention": "rectified_flow_t"}, tmp_path / "lying.pt")
    with pytest.raises(PipelineError, match="holds a rectified_flow_t model but 'edm' .* speaks ve_sigma"):
        load_denoiser(tmp_path / "lying.pt")
    torch.save({**blob, "convention": "vp_t"}, tmp_path / "unknown.pt")
    with pytest.raises(PipelineError, match="unknown convention 'vp_t'"):
        load_denoiser(tmp_path / "unknown.pt")


def test_registering_checks_the_convention_and_refuses_a_taken_name(monkeypatch):
    monkeypatch.setattr(checkpoint, "DENOISERS", dict(checkpoint.DENOISERS))

    class NoConvention(torch.nn.Module):
        pass

    with pytest.raises(ValueError, match="convention must be one of"):
        checkpoint.register_denoiser("x", NoConvention)
    with pytest.raises(ValueError, match="'edm' is already registered to EDMPrecond"):
        checkpoint.register_denoiser("edm", StraightVelocity)
    checkpoint.register_denoiser("flow", StraightVelocity)
    assert checkpoint.DENOISERS["flow"] is StraightVelocity and set(CONVENTIONS) >= {"ve_sigma", "rectified_flow_t"}


# --------------------------------------------------------------------------- backbones: a flow model in the same file

from pipeline.flow.backbone import FLOW_BACKBONE, FLOW_PRECOND, FlowSpec, RectifiedFlowVelocity, build_flow_model  # noqa: E402,I001

FLOW = FlowSpec(image_size=8, patch_size=2, num_layers=1, attention_head_dim=8, num_attention_heads=2,
                joint_attention_dim=8, caption_projection_dim=16, pooled_projection_dim=8, pos_embed_max_size=4,
                caption_tokens=2, num_classes=3)


def test_a_unet_file_records_its_backbone_and_a_file_without_the_key_reads_as_unet(tmp_path):
    torch.manual_seed(0)
    net = EDMPrecond(build_unet(SMALL)).eval()
    save_denoiser(tmp_path / "d.pt", net, unet=SMALL, precond="edm")
    blob = torch.load(tmp_path / "d.pt", weights_only=True)
    assert blob["backbone"] == "unet" and blob["unet"] == SMALL.to_json()  # the spec stays where it always was
    assert checkpoint.read_denoiser_backbone(tmp_path / "d.pt") == ("unet", SMALL)
    for key in ("backbone", "convention"):
        del blob[key]  # a file from before both keys existed
    torch.save(blob, tmp_path / "old.pt")
    assert checkpoint.read_denoiser_backbone(tmp_path / "old.pt") == ("unet", SMALL)
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(load_denoiser(tmp_path / "old.pt", convention="ve_sigma")(x, 0.3), net(x, 0.3))


def test_a_flow_mmdit_round_trips_and_each_loader_refuses_the_other_convention(tmp_path):
    torch.manual_seed(0)
    flow = build_flow_model(FLOW).eval()
    save_denoiser(tmp_path / "flow.pt", flow, backbone=FLOW, precond=FLOW_PRECOND, meta={"stage": "test"})
    blob = torch.load(tmp_path / "flow.pt", weights_only=True)
    assert (blob["backbone"], blob["convention"], blob["precond"]) == (FLOW_BACKBONE, "rectified_flow_t", FLOW_PRECOND)
    assert FLOW_BACKBONE in blob and "unet" not in blob
    assert checkpoint.read_denoiser_backbone(tmp_path / "flow.pt") == (FLOW_BACKBONE, FLOW)
    loaded = load_denoiser(tmp_path / "flow.pt", convention="rectified_flow_t")
    assert isinstance(loaded, RectifiedFlowVelocity) and not loaded.training and loaded.null_label == 3
    x, t, y = torch.randn(3, 1, 8, 8), torch.tensor([0.1, 0.5, 0.9]), torch.tensor([0, 2, 3])
    with torch.no_grad():
        assert torch.equal(loaded(x, t, y), flow(x, t, y))
    # a VE-sigma sampler refuses the flow file, a flow sampler the EDM file: one line each
    with pytest.raises(PipelineError, match="holds a rectified_flow_t model .* this needs ve_sigma"):
        load_denoiser(tmp_path / "flow.pt", convention="ve_sigma")
    save_denoiser(tmp_path / "edm.pt", EDMPrecond(build_unet(SMALL)), unet=SMALL, precond="edm")
    with pytest.raises(PipelineError, match="holds a ve_sigma model .* this needs rectified_flow_t"):
        load_denoiser(tmp_path / "edm.pt", convention="rectified_flow_t")


def test_backbone_errors_are_one_line(tmp_path, monkeypatch):
    net = EDMPrecond(build_unet(SMALL))
    with pytest.raises(ValueError, match="exactly one of unet= .* or backbone="):
        save_denoiser(tmp_path / "d.pt", net, precond="edm")
    with pytest.raises(ValueError, match="exactly one of unet="):
        save_denoiser(tmp_path / "d.pt", net, unet=SMALL, backbone=SMALL, precond="edm")
    with pytest.raises(ValueError, match="no backbone kind is registered for dict"):
        save_denoiser(tmp_path / "d.pt", net, backbone={"image_size": 8}, precond="edm")
    save_denoiser(tmp_path / "d.pt", net, unet=SMALL, precond="edm")
    blob = torch.load(tmp_path / "d.pt", weights_only=True)
    torch.save({**blob, "backbone": "vit"}, tmp_path / "vit.pt")
    with pytest.raises(PipelineError, match="backbone 'vit' is not known to this code"):
        load_denoiser(tmp_path / "vit.pt")
    torch.save({**blob, "backbone": FLOW_BACKBONE}, tmp_path / "nospec.pt")
    with pytest.raises(PipelineError, match="names backbone 'sd3_transformer' but holds no 'sd3_transformer' spec"):
        load_denoiser(tmp_path / "nospec.pt")
    monkeypatch.setattr(checkpoint, "BACKBONES", dict(checkpoint.BACKBONES))
    with pytest.raises(ValueError, match="'unet' is already registered to UNetSpec"):
        checkpoint.register_backbone("unet", FlowSpec, build_flow_model)
    with pytest.raises(ValueError, match="FlowSpec is already registered as backbone kind 'sd3_transformer'"):
        checkpoint.register_backbone("mmdit", FlowSpec, build_flow_model)
