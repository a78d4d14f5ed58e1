from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fnrt.loader.stores import FileStore, KeyNotFound, PreconditionFailed, open_store


def test_put_get_list_delete(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    etag = store.put("a/b.json", b"1")
    assert store.get("a/b.json") == (b"1", etag)
    store.put_stream("a/c/d", [b"x", b"y"])
    assert store.list("a/") == ["a/b.json", "a/c/d"]
    assert store.local_path("a/c/d") == tmp_path / "a/c/d"
    store.delete("a/b.json")
    store.delete("a/b.json")  # missing is fine
    with pytest.raises(KeyNotFound):
        store.get("a/b.json")
    assert [p.name for p in (tmp_path / "a").iterdir() if p.name.endswith(".tmp")] == []


def test_conditional_writes(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.put("k", b"1", if_absent=True)
    with pytest.raises(PreconditionFailed):
        store.put("k", b"2", if_absent=True)
    _, etag = store.get("k")
    store.put("k", b"2", if_match=etag)
    with pytest.raises(PreconditionFailed):
        store.put("k", b"3", if_match=etag)  # stale
    assert store.get("k")[0] == b"2"


def test_a_failed_stream_leaves_nothing(tmp_path: Path) -> None:
    store = FileStore(tmp_path)

    def broken():  # type: ignore[no-untyped-def]
        yield b"partial"
        raise OSError("connection lost")

    with pytest.raises(OSError):
        store.put_stream("blob", broken())
    assert not store.exists("blob")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "."])
def test_keys_cannot_escape(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError):
        FileStore(tmp_path).get(key)


def test_only_one_conditional_writer_wins(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.put("k", b"0")
    _, etag = store.get("k")

    def attempt(i: int) -> bool:
        try:
            store.put("k", str(i).encode(), if_match=etag)
        except PreconditionFailed:
            return False
        return True

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(attempt, range(1, 17))) == 1


def test_open_store_chooses_by_uri(tmp_path: Path) -> None:
    assert isinstance(open_store(tmp_path), FileStore)
    assert open_store(tmp_path.as_uri()).root == tmp_path.resolve()
    with pytest.raises(ValueError, match="unsupported store"):
        open_store("ftp://x")
