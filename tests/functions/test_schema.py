"""The JSON Schema of fnrt.toml: what editors check against agrees with the manifest."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import jsonschema
import pytest

from fnrt.functions.errors import ManifestError
from fnrt.functions.manifest import Manifest, parse_manifest
from fnrt.functions.schema import manifest_schema

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = manifest_schema()
BASE = {"name": "mlp", "handler": "handler:Model"}


def test_the_published_copy_is_what_fnrt_schema_prints() -> None:
    published = json.loads((ROOT / "docs" / "fnrt.schema.json").read_text())
    assert published == SCHEMA, "run: .venv/bin/fnrt schema > docs/fnrt.schema.json"
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_every_field_of_the_manifest_is_in_it() -> None:
    assert set(SCHEMA["properties"]) == {f.name for f in dataclasses.fields(Manifest)}


@pytest.mark.parametrize("example", sorted(ROOT.glob("examples/*/fnrt.toml")), ids=str)
def test_the_examples_are_valid(example: Path) -> None:
    data = tomllib.loads(example.read_text())
    jsonschema.validate(data, SCHEMA)
    parse_manifest(data)


def test_a_manifest_with_every_section_set_is_valid() -> None:
    full = parse_manifest(
        {
            **BASE,
            "artifacts": {"model": "m.onnx"},
            "inputs": {"x": {"dtype": "float32", "shape": [-1, 4]}},
            "split": {"model": "model", "points": ["after.1"]},
            "environment": {"requirements": ["humanize==4.9.0"]},
            "rollout": {"policy": "canary", "sticky_header": "x-user"},
        }
    )
    jsonschema.validate(full.to_dict(), SCHEMA)


@pytest.mark.parametrize(
    "change",
    [
        {"unknown": 1},
        {"batching": {"max_batch": 8}},
        {"batching": {"mode": "eager"}},
        {"scaling": {"keep_alive_policy": "forever"}},
        {"scaling": {"load_at_start": "yes"}},
        {"inputs": {"x": {"dtype": "float31", "shape": [-1]}}},
        {"inputs": {"x": {"dtype": "float32"}}},
        {"isolation": {"mode": "vm"}},
        {"environment": {"requirements": "humanize"}},
        {"rollout": {"steps_percent": ["10"]}},
        {"handler": "not a handler"},
        {"name": "Bad Name"},
    ],
)
def test_what_the_schema_refuses_the_manifest_refuses(change: dict) -> None:
    data = {**BASE, **change}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, SCHEMA)
    with pytest.raises(ManifestError):
        parse_manifest(data)
