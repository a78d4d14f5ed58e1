"""The check at every load: sha256 the first time; after, the file's identity, and xxh3
when that changed."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from fnrt.functions.errors import CorruptBlob
from fnrt.loader import integrity
from fnrt.loader.integrity import (
    Verifier,
    bundle_files,
    fingerprint,
    quick_digest,
    tree_differences,
)


def test_one_read_gives_both_digests(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(10_000_000))
    found = fingerprint(path)
    assert found.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert found.xxh3 == quick_digest(path)


def test_a_file_changed_in_place_fails_even_with_its_mtime_restored(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    path = tmp_path / "blob"
    path.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    verifier = Verifier(tmp_path / "verified")
    verifier.check(path, digest)  # first: sha256, and the record
    verifier.check(path, digest)  # after: xxh3
    st = path.stat()
    with path.open("r+b") as f:
        f.seek(4096)
        f.write(b"\0" * 4096)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(CorruptBlob, match="changed since it was verified"):
        verifier.check(path, digest)


def test_a_file_that_never_matched_its_digest_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"not what was deployed")
    with pytest.raises(CorruptBlob, match="hashes to sha256:"):
        Verifier(tmp_path / "verified").check(path, "0" * 64)


def test_an_unchanged_file_is_not_read_again_and_a_touched_one_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(1 << 20)
    path = tmp_path / "blob"
    path.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    verifier = Verifier(tmp_path / "verified")
    verifier.check(path, digest)
    reads: list[Path] = []
    monkeypatch.setattr(integrity, "quick_digest", lambda p: reads.append(p) or quick_digest(p))
    for _ in range(3):
        verifier.check(path, digest)
    assert reads == []  # a stat said it is the file verified: no read at a load
    os.utime(path)  # touched, the same bytes: read once, then trusted again
    verifier.check(path, digest)
    verifier.check(path, digest)
    assert reads == [path]
    copy = tmp_path / "copy"
    copy.write_bytes(data)
    os.replace(copy, path)  # another file (inode) with the same bytes: read, accepted
    verifier.check(path, digest)
    assert reads == [path, path]


def _write_at(path: Path, data: bytes, start: int, end: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data[start:end], start)
    finally:
        os.close(fd)


def test_a_file_written_out_of_order_is_hashed_as_its_prefix_completes(tmp_path: Path) -> None:
    from fnrt.loader.integrity import Trailing
    from support import wait_until

    data = os.urandom(3 * integrity._CHUNK + 12_345)  # parts of one chunk, and a short one
    path = tmp_path / "part"
    hashing = Trailing(path)
    path.write_bytes(b"\0" * len(data))  # as ranged GETs do: sized first, then filled
    parts = [(0, 1), (1, 2), (2, 3)]
    bounds = [(a * integrity._CHUNK, b * integrity._CHUNK) for a, b in parts]
    bounds.append((3 * integrity._CHUNK, len(data)))
    for start, end in (bounds[2], bounds[0]):  # out of order: only the first is hashable
        _write_at(path, data, start, end)
        hashing.written(start, end)
    wait_until(lambda: hashing._hashed == bounds[0][1])
    _write_at(path, data, *bounds[1])
    hashing.written(*bounds[1])
    wait_until(lambda: hashing._hashed == bounds[2][1])  # the third followed the second
    _write_at(path, data, *bounds[3])  # the last, never told of: hashed at the end
    assert hashing.result() == fingerprint(path)
    hashing.close()


def test_a_write_that_failed_stops_the_hashing_and_a_short_file_is_an_error(
    tmp_path: Path,
) -> None:
    from fnrt.loader.integrity import Trailing
    from support import wait_until

    stopped = Trailing(tmp_path / "never-written")
    stopped.close()  # the fetch failed: the thread ends without the file
    path = tmp_path / "short"
    path.write_bytes(b"x" * 10)
    hashing = Trailing(path)
    hashing.written(0, 20)  # told of more than the file holds: a writer's bug
    wait_until(lambda: not hashing._thread.is_alive())
    with pytest.raises(OSError, match="ended at byte 10"):
        hashing.result()
    hashing.close()


def test_a_blob_first_verified_is_made_read_only(tmp_path: Path) -> None:
    """A blob written before fnrt wrote them 0444 (an older store) loses its write bits
    at its first verification, before it is hashed and recorded: the record holds."""
    data = b"weights" * 1000
    path = tmp_path / "blob"
    path.write_bytes(data)
    os.chmod(path, 0o664)
    verifier = Verifier(tmp_path / "verified")
    verifier.check(path, hashlib.sha256(data).hexdigest())
    assert path.stat().st_mode & 0o777 == 0o444
    record = integrity.read_record(tmp_path / "verified" / hashlib.sha256(data).hexdigest())
    assert record is not None and record.unchanged(path)  # not read again at the next load


def test_a_code_tree_differs_from_its_bundle_where_a_file_changed_went_or_came(
    tmp_path: Path,
) -> None:
    """``tree_differences``, the check of the unpacked code at every load: each file
    changed, missing or added is named, at any depth; ``__pycache__`` is not code; a
    link to a folder (which no bundle unpacks) is a difference of its own."""
    source = {"handler.py": b"x = 1\n", "pkg/__init__.py": b"", "pkg/deep/model.py": b"y = 2\n"}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in source.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    expected = bundle_files(gzip.compress(raw.getvalue()))
    tree = tmp_path / "code"
    for name, data in source.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(data)
    (tree / "pkg" / "__pycache__").mkdir()
    (tree / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"compiled")
    (tree / "__pycache__").write_bytes(b"")  # a file of that name: not code either
    (tree / "dangling").symlink_to(tmp_path / "nowhere")  # a broken link: nothing
    assert tree_differences(tree, expected) == []
    (tree / "pkg" / "__init__.py").unlink()  # a link to a file counts as that file
    (tree / "pkg" / "__init__.py").symlink_to(tree / "dangling-target")
    (tree / "dangling-target").write_bytes(b"")
    assert tree_differences(tree, expected) == ["dangling-target"]
    (tree / "dangling-target").unlink()
    (tree / "pkg" / "__init__.py").unlink()
    (tree / "pkg" / "__init__.py").write_bytes(b"")
    (tree / "loop").symlink_to(tree / "loop")  # a link loop: unreadable, a difference
    assert tree_differences(tree, expected) == ["loop"]
    (tree / "loop").unlink()

    (tree / "pkg" / "deep" / "model.py").write_bytes(b"y = 3\n")
    (tree / "handler.py").unlink()
    (tree / "extra.py").write_bytes(b"")
    (tree / "elsewhere").symlink_to(tmp_path, target_is_directory=True)
    assert tree_differences(tree, expected) == [
        "elsewhere",
        "extra.py",
        "handler.py",
        "pkg/deep/model.py",
    ]
