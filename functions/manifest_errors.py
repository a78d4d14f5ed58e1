"""pydantic's validation errors, said as :class:`ManifestError` naming the field.

A manifest's sections declare their types and bounds once (pydantic
dataclasses, :mod:`fnrt.functions.manifest`); when a value does not fit, the
message is made from the same declaration, through the JSON Schema it gives::

    manifest field 'batching.max_batch_size': must be an integer from 1 to 4096, got 0
    manifest field 'rollout.policy': must be one of ['immediate', 'canary'], got 'yolo'
    manifest field 'batching.max_wait': unknown key (known: ['max_batch_size', ...])

A check between fields (a section's ``__post_init__``) raises ManifestError
itself; it is placed under the section it came from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

import pydantic

from fnrt.functions.errors import ManifestError

T = TypeVar("T")


class Validator(Generic[T]):
    """Instances of a pydantic dataclass from plain data (TOML, JSON)."""

    def __init__(self, cls: type[T]) -> None:
        self.cls = cls
        self.adapter = pydantic.TypeAdapter(cls)

    def validate(self, data: Mapping[str, Any]) -> T:
        try:
            return self.adapter.validate_python(data)
        except pydantic.ValidationError as exc:
            raise manifest_error(exc, self.cls) from None


_SCHEMAS: dict[type[Any], dict[str, Any]] = {}


def schema_of(cls: type[Any]) -> dict[str, Any]:
    """The JSON Schema pydantic makes of ``cls`` (its ``$defs`` resolved by :func:`_node`)."""
    if cls not in _SCHEMAS:
        _SCHEMAS[cls] = pydantic.TypeAdapter(cls).json_schema()
    return _SCHEMAS[cls]


def manifest_error(exc: pydantic.ValidationError, cls: type[Any]) -> ManifestError:
    """The first error of ``exc`` (validating ``cls``) as a ManifestError; the others
    are counted."""
    errors = exc.errors(include_url=False)
    found = _error(errors[0], schema_of(cls))
    if len(errors) > 1:
        more = len(errors) - 1
        return ManifestError(found.field, f"{found.reason} (and {more} more)")
    return found


def _error(error: Any, schema: dict[str, Any]) -> ManifestError:
    loc: Sequence[str | int] = error["loc"]
    path = [str(part) for part in loc if isinstance(part, str) and part != "[key]"]
    field = ".".join(path) or "manifest"
    kind = error["type"]
    if kind in ("value_error", "assertion_error"):
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, ManifestError):  # a check between fields, of a section
            return ManifestError(".".join([*path, cause.field]), cause.reason)
        return ManifestError(field, str(cause or error["msg"]))
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        known = sorted((_node(schema, loc[:-1]) or {}).get("properties", {}))
        return ManifestError(field, f"unknown key (known: {known})")
    if kind == "missing":
        return ManifestError(field, "is required")
    node = _node(schema, loc)
    expected = _describe(schema, node) if node is not None else error["msg"].lower()
    items = [part for part in loc if isinstance(part, int)]
    where = f"item {items[-1]} " if items else ""
    return ManifestError(field, f"{where}must be {expected}, got {error['input']!r}")


def _deref(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while True:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            node = {**schema["$defs"][name], **{k: v for k, v in node.items() if k != "$ref"}}
        elif len(node.get("allOf", ())) == 1:
            node = {**node["allOf"][0], **{k: v for k, v in node.items() if k != "allOf"}}
        elif _optional_section(node):  # a section that may be left out ([generation])
            given = next(n for n in node["anyOf"] if n.get("type") != "null")
            node = {**given, **{k: v for k, v in node.items() if k != "anyOf"}}
        else:
            return node


def _optional_section(node: dict[str, Any]) -> bool:
    options = node.get("anyOf", ())
    return len(options) == 2 and {"type": "null"} in options and any("$ref" in n for n in options)


def _node(schema: dict[str, Any], loc: Sequence[str | int]) -> dict[str, Any] | None:
    """The schema of the value at ``loc`` (None where the path leaves the schema)."""
    node = _deref(schema, schema)
    for at, part in enumerate(loc):
        if loc[at + 1 : at + 2] == ("[key]",):  # the key itself is at fault
            return {"type": "string", **node.get("propertyNames", {})}
        if isinstance(part, int):
            if "items" not in node:
                return None
            node = node["items"]
        elif part in node.get("properties", {}):
            node = node["properties"][part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        elif node.get("patternProperties"):  # a mapping whose keys have a pattern
            node = next(iter(node["patternProperties"].values()))
        else:
            return None
        node = _deref(schema, node)
    return node


def _describe(schema: dict[str, Any], node: dict[str, Any], plural: bool = False) -> str:
    """What a value of ``node`` is, in words: ``an integer from 1 to 4096``."""
    if "enum" in node:
        return f"one of {node['enum']}"
    if "anyOf" in node:  # an optional value: what it is when given (unset is left out)
        given = [_deref(schema, n) for n in node["anyOf"] if n.get("type") != "null"]
        return " or ".join(_describe(schema, n, plural) for n in given) or "valid"
    kind = node.get("type")
    description = node.get("description")
    if kind == "boolean":
        return "true or false"
    if kind in ("integer", "number"):
        if description in ("seconds", "milliseconds", "bytes", "GB·s"):
            noun = f"number{'s' if plural else ''} of {description}"
        else:
            noun = ("integer" if kind == "integer" else "number") + ("s" if plural else "")
        article = "" if plural else ("an " if noun.startswith("i") else "a ")
        return article + noun + _bounds(node)
    if kind == "string":
        if description:
            return str(description)
        if "pattern" in node:
            return (
                f"{'' if plural else 'a '}string{'s' if plural else ''} matching {node['pattern']}"
            )
        return "strings" if plural else "a string"
    if kind == "array":
        items = _deref(schema, node.get("items", {}))
        if items.get("description"):
            return f"a list, each {items['description']}"
        return f"a list of {_describe(schema, items, plural=True)}"
    if kind == "object":
        required = node.get("required")
        needs = f" with {' and '.join(repr(r) for r in required)}" if required else ""
        return f"{'tables' if plural else 'a table'}{needs}"
    return description or "valid"


def _bounds(node: dict[str, Any]) -> str:
    low, high = node.get("minimum"), node.get("maximum")
    if node.get("exclusiveMinimum") is not None and low is not None:
        low = None if node["exclusiveMinimum"] >= low else low
    if node.get("exclusiveMaximum") is not None and high is not None:
        high = None if node["exclusiveMaximum"] <= high else high
    if low is not None and high is not None:
        return f" from {_number(low)} to {_number(high)}"
    parts = []
    if low is not None:
        parts.append(f">= {_number(low)}")
    if node.get("exclusiveMinimum") is not None:
        parts.append(f"> {_number(node['exclusiveMinimum'])}")
    if high is not None:
        parts.append(f"<= {_number(high)}")
    if node.get("exclusiveMaximum") is not None:
        parts.append(f"< {_number(node['exclusiveMaximum'])}")
    return (" " + " and ".join(parts)) if parts else ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)
