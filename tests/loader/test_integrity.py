"""The check at every load: sha256 the first time; after, the file's identity, and xxh3
when that changed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from fnrt.functions.errors import CorruptBlob
from fnrt.loader import integrity
from fnrt.loader.integrity import Verifier, fingerprint, quick_digest


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
