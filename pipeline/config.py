"""Configuration: JSON-schema validation with one-line errors, defaults, config ids.

The schema (``pipeline/schema/config.schema.yaml``) is the single source of truth for
every key, its type and its default. ``rules/common.smk`` and the package both call
:func:`validate_config`, so a typo or a wrong type in ``config.yaml`` or a preset always
ends in one line such as::

    config error at data.private.n_test: expected an integer >= 10, got 5
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_RESOURCE = "schema/config.schema.yaml"


class ConfigError(ValueError):
    """A configuration value is missing, misspelt or of the wrong type/range."""


@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    text = resources.files("pipeline").joinpath(SCHEMA_RESOURCE).read_text()
    return yaml.safe_load(text)


def schema_path() -> Path:
    return Path(str(resources.files("pipeline").joinpath(SCHEMA_RESOURCE)))


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


def validate_config(config: Mapping[str, Any] | None, *, source: str = "config") -> dict[str, Any]:
    """Validate ``config`` against the schema and return a copy with defaults filled.

    Raises :class:`ConfigError` with one line naming the first offending key.
    """
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise ConfigError(f"{source}: expected a mapping of keys at the top level, got {type(config).__name__}")
    filled = copy.deepcopy(dict(config))
    schema = load_schema()
    _fill_defaults(filled, schema)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(filled), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        msg = _format_error(errors[0])
        raise ConfigError(msg if source == "config" else f"{source}: {msg}")
    return filled


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
