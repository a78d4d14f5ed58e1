"""The JSON Schema of ``fnrt.toml``: what pydantic makes of the manifest's dataclasses.

Editors that read JSON Schema for TOML (Taplo / Even Better TOML, with a
``#:schema`` comment or their settings) complete and check a manifest with
it; ``fnrt schema`` prints it and ``docs/fnrt.schema.json`` is a copy (a test
keeps the two the same). The schema says the shapes, bounds and choices; the
checks between fields (a memory limit in thread mode, a split model that is
no artifact) stay with the sections' ``__post_init__``, whose messages name
the field.
"""

from __future__ import annotations

import copy
from typing import Any

from fnrt.functions.manifest import Manifest
from fnrt.functions.manifest_errors import schema_of


def manifest_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a function manifest."""
    made = copy.deepcopy(schema_of(Manifest))
    _tidy(made)
    made["required"] = ["handler"]  # the name may come from fnrt deploy --name
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **made,
        "title": "fnrt function manifest (fnrt.toml)",
    }


def _tidy(node: Any) -> None:
    """Descriptions on one line; no titles pydantic makes from field names; a mapping
    with a key pattern takes no other keys; an optional value is its type (TOML has no
    null: unset is leaving the key out)."""
    if isinstance(node, dict):
        options = node.get("anyOf")
        if (
            isinstance(options, list)
            and {"type": "null"} in options
            and node.get("default", 0) is None
        ):
            given = [o for o in options if o != {"type": "null"}]
            del node["anyOf"], node["default"]
            node.update(given[0] if len(given) == 1 else {"anyOf": given})
        for key in ("properties", "$defs"):
            for child in node.get(key, {}).values():
                if isinstance(child, dict):
                    child.pop("title", None)
        if "patternProperties" in node:  # keys that match none are refused, as by fnrt
            node["additionalProperties"] = False
        if isinstance(node.get("description"), str):
            node["description"] = " ".join(node["description"].split())
        for value in node.values():
            _tidy(value)
    elif isinstance(node, list):
        for value in node:
            _tidy(value)
