from __future__ import annotations

import os
from pathlib import Path

import pytest

from fnrt.functions.bundle import pack, unpack_code
from fnrt.functions.errors import BadBundle, ManifestError
from fnrt.functions.manifest import load_manifest
from fnrt.functions.version import FileRef, VersionManifest
from support import hostile_bundle, write_function


def version_of(folder: Path) -> VersionManifest:
    manifest = load_manifest(folder)
    bundle = pack(folder, manifest)
    return VersionManifest(manifest, bundle.code_ref, bundle.artifacts)


def test_same_content_same_version_whatever_the_times(tmp_path: Path) -> None:
    a = write_function(tmp_path / "a", "echo", files={"lib/util.py": b"X = 1\n"})
    b = write_function(tmp_path / "b", "echo", files={"lib/util.py": b"X = 1\n"})
    os.utime(b / "handler.py", (1, 1))
    assert version_of(a).version == version_of(b).version
    (b / "lib" / "util.py").write_text("X = 2\n")
    assert version_of(a).version != version_of(b).version


def test_bundle_leaves_out_artifacts_caches_and_excluded(tmp_path: Path) -> None:
    folder = write_function(
        tmp_path,
        "echo",
        files={
            "weights/a.bin": b"a" * 10,
            "weights/sub/b.bin": b"b" * 20,
            "__pycache__/handler.cpython-311.pyc": b"junk",
            ".git/HEAD": b"ref",
            "notes.txt": b"skip me",
        },
    )
    toml = folder / "fnrt.toml"
    toml.write_text(
        toml.read_text().replace(
            'handler = "handler:Echo"',
            'handler = "handler:Echo"\nexclude = ["*.txt"]\n\n[artifacts]\nw = "weights"',
        )
    )
    manifest = load_manifest(folder)
    bundle = pack(folder, manifest)
    unpack_code(bundle.code, tmp_path / "out")
    assert sorted(
        p.relative_to(tmp_path / "out").as_posix()
        for p in (tmp_path / "out").rglob("*")
        if p.is_file()
    ) == [
        "fnrt.toml",
        "handler.py",
    ]
    ref = bundle.artifacts["w"]
    assert ref.is_dir and [f.rel for f in ref.files] == ["a.bin", "sub/b.bin"]
    assert ref.size_bytes == 30
    vm = VersionManifest(manifest, bundle.code_ref, bundle.artifacts)
    assert VersionManifest.from_dict(vm.to_dict()) == vm
    assert len(vm.blobs()) == 3


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        ([("../evil.py", b"x = 1", None)], "not a plain relative path"),
        ([("/etc/evil.py", b"x = 1", None)], "not a plain relative path"),
        ([("ok/../../evil.py", b"x = 1", None)], "not a plain relative path"),
        ([("link", None, "/etc/passwd")], "not a regular file"),
    ],
)
def test_a_hostile_bundle_writes_nothing(tmp_path: Path, entries: list, reason: str) -> None:
    dest = tmp_path / "code"
    with pytest.raises(BadBundle, match=reason):
        unpack_code(hostile_bundle(*entries), dest)
    assert not dest.exists() and not (tmp_path / "evil.py").exists()


def test_a_bundle_that_is_not_a_tarball_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BadBundle, match="not a readable"):
        unpack_code(b"not gzip at all", tmp_path / "code")


def test_a_bundle_that_unpacks_past_its_bound_is_refused(tmp_path: Path) -> None:
    bomb = hostile_bundle(("big.bin", bytes(4096), None))
    with pytest.raises(BadBundle, match="more than 1000 bytes"):
        unpack_code(bomb, tmp_path / "code", max_bytes=1000)


@pytest.mark.parametrize("rel", ["../../x", "/abs", "a//b", "a/./b", "a\\b", "a/.."])
def test_folder_artifact_files_must_stay_inside(rel: str) -> None:
    with pytest.raises(ManifestError, match="plain relative path"):
        FileRef(rel, "0" * 64, 1)
