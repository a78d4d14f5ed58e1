"""Version ids of versions stored by an older fnrt, which wrote whole numbers as ints."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from fnrt.functions.errors import FnrtError
from fnrt.functions.version import VersionManifest
from support import packed, write_function


def as_an_older_fnrt_stored_it(vm: VersionManifest) -> dict[str, Any]:
    """``vm`` as stored before manifests were parsed into floats: 300, not 300.0, and
    the id of that content."""
    data = vm.to_dict()

    def ints(value: Any) -> Any:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, dict):
            return {k: ints(v) for k, v in value.items()}
        if isinstance(value, list):
            return [ints(v) for v in value]
        return value

    content = {k: ints(data[k]) for k in ("manifest", "bundle", "artifacts")}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return {**content, "version": "v-" + hashlib.sha256(canonical.encode()).hexdigest()[:12]}


def test_an_older_version_keeps_its_id_and_travels_as_stored(tmp_path: Path) -> None:
    vm = packed(write_function(tmp_path, "old"))[0]
    stored = as_an_older_fnrt_stored_it(vm)
    assert stored["version"] != vm.version  # the same content, written otherwise
    read = VersionManifest.from_dict(json.loads(json.dumps(stored)))
    assert read.version == stored["version"]
    assert read.manifest == vm.manifest  # parsed as any version
    again = VersionManifest.from_dict(json.loads(json.dumps(read.to_dict())))  # to a worker
    assert again.version == stored["version"]


def test_a_changed_version_is_still_refused(tmp_path: Path) -> None:
    vm = packed(write_function(tmp_path, "old"))[0]
    stored = as_an_older_fnrt_stored_it(vm)
    stored["manifest"]["description"] = "changed after it was stored"
    with pytest.raises(FnrtError, match="does not match its content"):
        VersionManifest.from_dict(stored)
    current = vm.to_dict()
    current["manifest"]["description"] = "changed"
    with pytest.raises(FnrtError, match="does not match its content"):
        VersionManifest.from_dict(current)


def test_what_a_version_imports_travels_with_it_and_is_not_part_of_its_id(
    tmp_path: Path,
) -> None:
    vm = packed(write_function(tmp_path, "imp"))[0]
    stamped = vm.stamped("2026-12-05T00:00:00Z", ("idna", "numpy"))
    assert stamped.version == vm.version
    data = stamped.to_dict()
    assert data["imports"] == ["idna", "numpy"]
    assert "imports" not in vm.to_dict()  # none: the record is as it was
    assert VersionManifest.from_dict(json.loads(json.dumps(data))) == stamped
    for bad in ("numpy", ["numpy", "not a name"], [3], ["m"] * 65):
        with pytest.raises(FnrtError, match="imports"):
            VersionManifest.from_dict({**data, "imports": bad})


def test_an_older_version_stamped_keeps_its_id(tmp_path: Path) -> None:
    vm = packed(write_function(tmp_path, "old"))[0]
    stored = as_an_older_fnrt_stored_it(vm)
    read = VersionManifest.from_dict(stored).stamped("2026-12-05T00:00:00Z", ("idna",))
    assert read.version == stored["version"]
    assert read.to_dict()["imports"] == ["idna"]
