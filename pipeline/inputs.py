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
    inputs (STRAIGHTDP's public set, the diagnostics' zero-shot CLIP) only when it is chosen. The
    modules that import torch are imported only where the config asks for what they check, so the
    default config is checked in milliseconds.
    """
    data, methods = cfg["data"], cfg["methods"]
    checks: list[Check] = [
        ("data.private.source", lambda: layout.check_available(data["private"]["source"], data["data_root"])),
        _public_check("data.public", data["public"], data["data_root"]),
    ]
    if "straightdp" in methods:
        checks.append(_public_check("straightdp.public", cfg["straightdp"]["public"], data["data_root"]))
    evaluation = cfg["evaluation"]
    if evaluation["clip"]["enabled"] and evaluation["clip"]["source"] == "pretrained":
        checks.append(("evaluation.clip.pretrained_path", lambda: _clip_weights(evaluation["clip"])))
    if evaluation["feature_extractor"] == "inception-v3-compat":
        checks.append(("evaluation.inception_weights", lambda: _inception_weights(evaluation["inception_weights"])))
    if cfg["pretrain"].get("source") == "diffusers":
        checks.append(("pretrain.path", lambda: _public_model(cfg)))
    if "straightdp" in methods and cfg["straightdp"]["pretrain"].get("source") == "diffusers":
        checks.append(("straightdp.pretrain.path", lambda: _public_flow(cfg)))
    zero_shot = cfg["empden_diagnostics"]["clip"]
    if "empden_diagnostics" in methods and zero_shot["model"] and zero_shot["checkpoint"]:  # used only when both set
        checks.append(("empden_diagnostics.clip.checkpoint", lambda: _zero_shot_checkpoint(zero_shot)))
    return checks


def _public_check(where: str, public: Mapping[str, Any], data_root: str) -> Check:
    """(key, check) of one public section (``data.public`` or ``straightdp.public``)."""
    if public["source"] != "image_folder":
        return f"{where}.source", lambda: layout.check_available(public["source"], data_root)
    if not public.get("path"):
        return f"{where}.path", lambda: _no_folder(where)
    return f"{where}.path", lambda: layout.locate_image_folder(public["path"])


def _no_folder(where: str) -> None:
    # the data stage's own words for it (pipeline.data.stage.public_split)
    raise ConfigError(f"config error at {where}.path: expected a folder of class sub-folders "
                      f"for source image_folder, got null")


def _public_model(cfg: Mapping[str, Any]) -> None:
    from pipeline.config import RGB_SOURCES
    from pipeline.training.public import check_folder  # torch-free: reads config.json only

    data = cfg["data"]
    check_folder(cfg["pretrain"].get("path"), image_size=int(data["image_size"]),
                 channels=3 if data["private"]["source"] in RGB_SOURCES else 1)


def _public_flow(cfg: Mapping[str, Any]) -> None:
    from pipeline.config import declared_private
    from pipeline.flow.public import check_public_flow  # torch: only when a public flow is imported
    from pipeline.methods.straightdp.wiring import sample_shape

    c, side, _ = sample_shape(cfg, cfg["straightdp"])
    check_public_flow(cfg["straightdp"]["pretrain"], shape=(c, side, side), n_classes=declared_private(cfg)["n_classes"])


def _clip_weights(clip: Mapping[str, Any]) -> None:
    from pipeline.evaluation.clip import pretrained_weights  # torch: only when a pretrained CLIP is configured

    pretrained_weights(clip)


def _inception_weights(configured: str | None) -> None:
    from pipeline.evaluation.fidelity import inception_weights_path  # torch: its hub cache is where null points

    inception_weights_path(configured)


def _zero_shot_checkpoint(clip: Mapping[str, Any]) -> None:
    from pipeline.diagnostics.classifiers import zero_shot_checkpoint  # torch: only when CLIP is configured

    zero_shot_checkpoint(clip["checkpoint"], clip["class_names"] or [])
