"""The JSON Schema of ``fnrt.toml``, made from the manifest's own dataclasses.

Editors that read JSON Schema for TOML (Taplo / Even Better TOML, with a
``#:schema`` comment or their settings) complete and check a manifest with
it; ``fnrt schema`` prints it and ``docs/fnrt.schema.json`` is a copy (a test
keeps the two the same). The schema says the shapes and the choices; the
checks between fields (a memory limit in thread mode, a split model that is
no artifact) stay with :func:`fnrt.functions.manifest.parse_manifest`, whose
messages name the field.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from fnrt.functions.dtypes import DTYPES
from fnrt.functions.manifest import (
    KEEP_ALIVE_POLICIES,
    NAME_PATTERN,
    PRIORITIES,
    ROLLOUT_POLICIES,
    BatchingConfig,
    BreakerConfig,
    EnvironmentConfig,
    IsolationConfig,
    IsolationMode,
    RequestsConfig,
    ResultCacheConfig,
    RolloutConfig,
    ScalingConfig,
    SplitConfig,
    TensorSpec,
)

_IDENTIFIER = "[A-Za-z_][A-Za-z0-9_]*"
_HANDLER_PATTERN = f"^{_IDENTIFIER}(\\.{_IDENTIFIER})*:{_IDENTIFIER}$"

#: The values a string field takes, where it has a fixed set.
_CHOICES: dict[tuple[type[Any], str], list[str]] = {
    (BatchingConfig, "mode"): ["fixed", "adaptive"],
    (ScalingConfig, "keep_alive_policy"): list(KEEP_ALIVE_POLICIES),
    (RequestsConfig, "default_priority"): list(PRIORITIES),
    (ResultCacheConfig, "backend"): ["memory", "redis"],
    (RolloutConfig, "policy"): list(ROLLOUT_POLICIES),
    (IsolationConfig, "mode"): ["", *(m.value for m in IsolationMode)],
    (TensorSpec, "dtype"): sorted(DTYPES),
}

_SECTIONS: dict[str, type[Any]] = {
    "batching": BatchingConfig,
    "scaling": ScalingConfig,
    "requests": RequestsConfig,
    "result_cache": ResultCacheConfig,
    "rollout": RolloutConfig,
    "breaker": BreakerConfig,
    "split": SplitConfig,
    "isolation": IsolationConfig,
    "environment": EnvironmentConfig,
}


def manifest_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a function manifest."""
    tensors = {"type": "object", "additionalProperties": _table(TensorSpec, all_required=True)}
    properties: dict[str, Any] = {
        "name": {
            "type": "string",
            "pattern": NAME_PATTERN.pattern,
            "description": "the function's name in URLs (or fnrt deploy --name)",
        },
        "handler": {
            "type": "string",
            "pattern": _HANDLER_PATTERN,
            "description": "module:attribute of the handler class or function, e.g. handler:Model",
        },
        "description": {"type": "string"},
        "artifacts": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "name -> a file or folder in the function folder (memory-mapped)",
        },
        "inputs": {**tensors, "description": "name -> {dtype, shape}; -1 is any length"},
        "outputs": {**tensors, "description": "name -> {dtype, shape}; -1 is any length"},
        **{name: _table(cls) for name, cls in _SECTIONS.items()},
        "exclude": {
            "type": "array",
            "items": {"type": "string"},
            "description": "glob patterns left out of the code bundle",
        },
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "fnrt function manifest (fnrt.toml)",
        "type": "object",
        "required": ["handler"],
        "additionalProperties": False,
        "properties": properties,
    }


def _table(cls: type[Any], *, all_required: bool = False) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    defaults = None if all_required else cls()
    properties = {}
    for f in dataclasses.fields(cls):
        schema = _type(hints[f.name])
        choices = _CHOICES.get((cls, f.name))
        if choices is not None:
            schema["enum"] = choices
        if defaults is not None:
            schema["default"] = _plain(getattr(defaults, f.name))
        properties[f.name] = schema
    table: dict[str, Any] = {"type": "object", "additionalProperties": False}
    if cls.__doc__:
        table["description"] = " ".join(cls.__doc__.split())
    table["properties"] = properties
    if all_required:
        table["required"] = sorted(properties)
    return table


def _type(hint: Any) -> dict[str, Any]:
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    if hint is float:
        return {"type": "number"}
    if hint is str:
        return {"type": "string"}
    if typing.get_origin(hint) is tuple:
        return {"type": "array", "items": _type(typing.get_args(hint)[0])}
    raise TypeError(f"no JSON Schema for {hint!r}")  # a new field's type: add it here


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value
