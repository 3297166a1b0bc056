"""Inputs from outside the results tree (datasets, weights files), checked before any job is scheduled.

``rules/common.smk`` calls :func:`check_inputs_exist` right after
:func:`pipeline.config.validate_config`. Why before: Snakemake deletes a job's outputs before
running it, so a data source that fails inside ``prepare_data`` has already removed every split
of a finished run, and the new params are recorded (restoring the files then replans the whole
DAG). A missing input instead stops the run with one line naming the key and the path expected::

    config error at data.private.source: MNIST not found: looked in /home/me/data/MNIST/raw for ...

It is not part of :func:`~pipeline.config.validate_config`: a config is valid on a machine that
lacks the data (tests, a dry run elsewhere). A module of its own because it reaches into the
consumers (``data``, ``evaluation``, ``diagnostics``), which import ``pipeline.config`` themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pipeline.config import ConfigError
from pipeline.data import layout
from pipeline.plugins import declared_for
from pipeline.stage import PipelineError

#: one input to check: the config key that names it, and a check raising a one-line error
Check = tuple[str, Callable[[], object]]


def check_inputs_exist(cfg: Mapping[str, Any]) -> None:
    """Every dataset and weights file the config's jobs will read is on disk.

    ``cfg`` is validated with defaults filled. Presence only, with the functions the consumers
    themselves call first, so the two cannot disagree (a dataset's contents are parsed by its
    loader, a truncated file is the job's error). Raises :class:`ConfigError`: one line naming the
    key and the path expected.
    """
    for key, check in input_checks(cfg):
        try:
            check()
        except PipelineError as exc:  # DataNotFoundError, or a consumer's own missing-file error
            message = str(exc)
            raise ConfigError(message if message.startswith("config error at ") else
                              f"config error at {key}: {message}") from None


def input_checks(cfg: Mapping[str, Any]) -> list[Check]:
    """(config key, check) of every input outside the results tree the config's jobs read.

    The data splits and the evaluation core are built whatever ``methods`` says; a method's own
    inputs only when it is chosen, by the checks it declares (:attr:`pipeline.plugins.Method.input_checks`). The
    modules that import torch are imported only where the config asks for what they check, so the
    default config is checked in milliseconds.
    """
    data = cfg["data"]
    checks: list[Check] = [
        ("data.private.source", lambda: layout.check_available(data["private"]["source"], data["data_root"])),
        layout.public_section_check("data.public", data["public"], data["data_root"]),
    ]
    evaluation = cfg["evaluation"]
    if evaluation["clip"]["enabled"] and evaluation["clip"]["source"] == "pretrained":
        checks.append(("evaluation.clip.pretrained_path", lambda: _clip_weights(evaluation["clip"])))
    if evaluation["feature_extractor"] == "inception-v3-compat":
        checks.append(("evaluation.inception_weights", lambda: _inception_weights(evaluation["inception_weights"])))
    if cfg["pretrain"].get("source") == "diffusers":
        checks.append(("pretrain.path", lambda: _public_model(cfg)))
    for checks_of in declared_for(cfg["methods"], "input_checks"):  # each chosen method's own inputs
        checks.extend(checks_of(cfg))
    return checks


def _public_model(cfg: Mapping[str, Any]) -> None:
    from pipeline.config import RGB_SOURCES
    from pipeline.training.public import check_folder  # torch-free: reads config.json only

    data = cfg["data"]
    check_folder(cfg["pretrain"].get("path"), image_size=int(data["image_size"]),
                 channels=3 if data["private"]["source"] in RGB_SOURCES else 1)


def _clip_weights(clip: Mapping[str, Any]) -> None:
    from pipeline.evaluation.clip import pretrained_weights  # torch: only when a pretrained CLIP is configured

    pretrained_weights(clip)


def _inception_weights(configured: str | None) -> None:
    from pipeline.evaluation.fidelity import inception_weights_path  # torch: its hub cache is where null points

    inception_weights_path(configured)
