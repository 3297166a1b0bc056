"""One source of defaults (issue #14): the schema is the only place a default lives.

A stage dataclass that mirrors a schema section either carries no default for a schema-backed
field (it is filled from the schema, :func:`pipeline.config.schema_defaults`), or carries the
schema's own value. A default that drifts from the schema fails here, naming the field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pipeline.methods.accounting.blocks import AccountingConfig
from pipeline.config import load_schema, schema_defaults, validate_config
from pipeline.diffusion.schedule import EDMSchedule
from pipeline.evaluation.evalnet import TrainConfig
from pipeline.models.unet import UNetSpec
from pipeline.training.dp_denoiser import DPDenoiserConfig

#: (dataclass, schema section it mirrors): every stage dataclass whose fields are a section's keys
MIRRORS: list[tuple[type, tuple[str, ...]]] = [
    (DPDenoiserConfig, ("dpdm",)),
    (TrainConfig, ("evaluation", "evalnet")),
    (UNetSpec, ("pretrain", "unet")),
    (UNetSpec, ("dpdm", "unet")),
    (EDMSchedule, ("accounting",)),  # the EMPDEN grid: sigma_min, sigma_max, rho, N
    (AccountingConfig, ("accounting",)),
]
IDS = [f"{cls.__name__}-{'.'.join(section)}" for cls, section in MIRRORS]


def _plain(value: Any) -> Any:
    """A default as the schema (YAML) would write it: tuples are lists."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def disagreements(cls: type, section: tuple[str, ...]) -> list[str]:
    """'Class.field: default X, schema section.key says Y' for every field default the schema contradicts."""
    schema = schema_defaults(*section)
    out = []
    for f in dataclasses.fields(cls):
        default = _field_default(f)
        if default is dataclasses.MISSING or f.name not in schema:
            continue
        if _plain(default) != schema[f.name]:
            out.append(f"{cls.__name__}.{f.name}: default {default!r}, schema {'.'.join(section)}.{f.name} "
                       f"says {schema[f.name]!r}")
    return out


@pytest.mark.parametrize("cls, section", MIRRORS, ids=IDS)
def test_no_dataclass_default_disagrees_with_the_schema(cls, section):
    assert disagreements(cls, section) == []


@pytest.mark.parametrize("cls, section", MIRRORS, ids=IDS)
def test_each_mirror_shares_keys_with_its_section(cls, section):
    # a renamed field or section would make the comparison above vacuous
    node = load_schema()
    for key in section:
        node = node["properties"][key]
    shared = {f.name for f in dataclasses.fields(cls)} & set(node["properties"])
    assert len(shared) >= 3, f"{cls.__name__} shares only {sorted(shared)} with schema section {'.'.join(section)}"


def test_a_drifted_default_is_caught_and_named():
    @dataclasses.dataclass(frozen=True)
    class Drifted:  # DPDenoiserConfig's defaults before issue #14
        epochs: float = 10.0
        lr: float = 3e-4
        K: int = 1
        clip: float = 1.0

    found = disagreements(Drifted, ("dpdm",))
    assert [line.split(":")[0] for line in found] == ["Drifted.epochs", "Drifted.lr", "Drifted.K"]
    assert "schema dpdm.lr says 0.001" in found[1]


def test_dpdm_config_leaves_every_schema_backed_default_to_the_schema():
    section = schema_defaults("dpdm")
    with_defaults = [f.name for f in dataclasses.fields(DPDenoiserConfig)
                     if f.name in section and _field_default(f) is not dataclasses.MISSING]
    assert with_defaults == []


def test_dpdm_params_left_out_take_the_schema_defaults():
    section = schema_defaults("dpdm")
    cfg = DPDenoiserConfig.from_params({"epsilon": 1.0})
    for f in dataclasses.fields(DPDenoiserConfig):
        if f.name in section:
            assert _plain(getattr(cfg, f.name)) == section[f.name], f.name
    assert (cfg.epochs, cfg.lr, cfg.K) == (8, 1e-3, 2)  # the example, spelt out


def test_dpdm_params_given_win_and_a_partial_unet_is_completed_from_the_schema():
    cfg = DPDenoiserConfig.from_params({"epsilon": 1.0, "lr": 3e-4, "K": 1, "unet": {"block_out_channels": [8, 16],
                                                                                "norm_num_groups": 4}})
    assert (cfg.lr, cfg.K) == (3e-4, 1)
    assert cfg.unet == {**schema_defaults("dpdm", "unet"), "block_out_channels": [8, 16], "norm_num_groups": 4}


@pytest.mark.parametrize("section", [("dpdm",), ("pretrain",), ("accounting",), ("evaluation",), ("empden",),
                                     ("sensgeo",), ("data",), ("evaluation", "evalnet"), ("dpdm", "unet")])
def test_schema_defaults_are_what_validate_config_fills(section):
    filled: Any = validate_config({}, source="params")
    for key in section:
        filled = filled[key]
    assert schema_defaults(*section) == filled


def test_schema_defaults_refuses_what_is_not_a_section():
    with pytest.raises(KeyError, match="dpdm.nope"):
        schema_defaults("dpdm", "nope")
    with pytest.raises(KeyError, match="not a section"):
        schema_defaults("dpdm", "lr")


def test_schema_defaults_hands_out_a_copy():
    schema_defaults("dpdm")["unet"]["block_out_channels"].append(64)
    assert schema_defaults("dpdm")["unet"]["block_out_channels"] == [16, 32]


#: stage params a schema section also holds whose meaning at the stage differs from the section's (described by the
#: stage): the run's own parameterisation (the section's is the main table's), and a UNet spec that may be "init"
STAGE_MEANING = {"pipeline.training.dp_denoiser": {"parameterisation", "unet"}}


@pytest.mark.parametrize("module", ["pipeline.training.dp_denoiser", "pipeline.methods.dpdm.dpsgd_classifier",
                                    "pipeline.methods.dpdm.gradient_variance"])
def test_a_stage_mirroring_a_schema_section_describes_its_keys_with_the_schemas_words(module):
    """Issue #56, one spelling per key: the --help of a key the configuration holds is the schema's description (the
    docs' configuration reference reads the same), not a second text."""
    import importlib

    from pipeline.config import schema_descriptions, schema_keys

    stage = importlib.import_module(module)
    section = (stage.SCHEMA_SECTION,) if isinstance(stage.SCHEMA_SECTION, str) else stage.SCHEMA_SECTION
    schema = schema_descriptions(section, stage.SCHEMA_KEYS)
    assert {k: stage.PARAMS_DOC[k] for k in stage.SCHEMA_KEYS} == schema
    shared = set(stage.PARAMS_DOC) & set(schema_keys(*section))
    assert shared - set(stage.SCHEMA_KEYS) == STAGE_MEANING.get(module, set())
