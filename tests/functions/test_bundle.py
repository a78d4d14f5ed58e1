from __future__ import annotations

import os
from pathlib import Path

from fnrt.functions.bundle import pack, unpack_code
from fnrt.functions.manifest import load_manifest
from fnrt.functions.version import VersionManifest
from support import write_function


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
