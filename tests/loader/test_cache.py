"""The L2 disk cache: atomic, verified, fetched once across threads and processes, bounded."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from s3support import FaultProxy, MotoEndpoint

from fnrt.functions.errors import IntegrityError, StoreError
from fnrt.loader.cache import BlobCache, CacheConfig, choose_evictions

MiB = 1024 * 1024


def writer(data: bytes, calls: list[int] | None = None):  # type: ignore[no-untyped-def]
    def fetch(tmp: Path, written: object = None) -> None:
        if calls is not None:
            calls.append(1)
        tmp.write_bytes(data)

    return fetch


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_fetch_once_then_hit(tmp_path: Path) -> None:
    cache = BlobCache(CacheConfig(tmp_path))
    data = b"weights" * 1000
    calls: list[int] = []
    first = cache.get(digest_of(data), writer(data, calls))
    second = cache.get(digest_of(data), writer(data, calls))
    assert (first.fetched, second.fetched, len(calls)) == (True, False, 1)
    assert second.path.read_bytes() == data
    assert list((tmp_path / "tmp").iterdir()) == []


def test_concurrent_threads_download_once(tmp_path: Path) -> None:
    cache = BlobCache(CacheConfig(tmp_path))
    data = os.urandom(MiB)
    calls: list[int] = []
    started = threading.Barrier(8)

    def get(_: int) -> bool:
        started.wait()
        return cache.get(digest_of(data), writer(data, calls)).fetched

    with ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(get, range(8))) == [False] * 7 + [True]
    assert len(calls) == 1


def test_wrong_content_is_never_kept(tmp_path: Path) -> None:
    cache = BlobCache(CacheConfig(tmp_path))
    with pytest.raises(IntegrityError):
        cache.get(digest_of(b"right"), writer(b"wrong"))
    assert digest_of(b"right") not in cache
    assert not cache.path(digest_of(b"right")).exists()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_corrupted_file_is_detected_and_fetched_again(tmp_path: Path) -> None:
    cache = BlobCache(CacheConfig(tmp_path))
    data = os.urandom(4096)
    path = cache.get(digest_of(data), writer(data)).path
    with path.open("r+b") as f:  # bit rot / a stray write
        f.seek(100)
        f.write(b"\x00\x01\x02")
    calls: list[int] = []
    result = BlobCache(CacheConfig(tmp_path)).get(digest_of(data), writer(data, calls))
    assert result.fetched and len(calls) == 1
    assert result.path.read_bytes() == data


def test_a_download_killed_halfway_leaves_nothing_that_is_served(
    s3: MotoEndpoint, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = os.urandom(6 * MiB)
    s3.store("fnrt").put("blob", data)
    store = s3.store("fnrt", url=proxy.url)
    cache = BlobCache(CacheConfig(tmp_path))
    proxy.set("cut", cut_after_bytes=2 * MiB)  # every attempt dies halfway
    with pytest.raises(StoreError):
        cache.get(
            digest_of(data), lambda tmp, written: store.download("blob", tmp, written=written)
        )
    assert digest_of(data) not in cache and not cache.path(digest_of(data)).exists()
    assert list((tmp_path / "tmp").iterdir()) == []
    proxy.set("pass")
    assert (
        cache.get(
            digest_of(data), lambda tmp, written: store.download("blob", tmp, written=written)
        ).path.read_bytes()
        == data
    )


def test_leftovers_of_a_crash_are_swept_and_index_rebuilt(tmp_path: Path) -> None:
    cache = BlobCache(CacheConfig(tmp_path))
    data = b"kept"
    cache.get(digest_of(data), writer(data))
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    dead = tmp_path / "tmp" / f"9d441aee2461d229.{int(gone.stdout)}.abc.part"
    dead.write_bytes(b"half")
    running = tmp_path / "tmp" / f"9d441aee2461d229.{os.getpid()}.def.part"
    running.write_bytes(b"being written by another cache on this folder")
    again = BlobCache(CacheConfig(tmp_path))
    assert list((tmp_path / "tmp").iterdir()) == [running]
    assert digest_of(data) in again and again.size_bytes == len(data)


def test_lru_eviction_skips_pinned_blobs(tmp_path: Path) -> None:
    cache = BlobCache(CacheConfig(tmp_path, budget_bytes=3000))
    blobs = [bytes([i]) * 1000 for i in range(3)]
    for b in blobs:
        cache.get(digest_of(b), writer(b))
    cache.pin(digest_of(blobs[0]))  # oldest, but an instance uses it
    new = b"n" * 1000
    cache.get(digest_of(new), writer(new), size_hint=len(new))
    assert digest_of(blobs[0]) in cache and digest_of(blobs[1]) not in cache
    assert digest_of(blobs[2]) in cache and digest_of(new) in cache
    cache.unpin(digest_of(blobs[0]))


def test_choose_evictions() -> None:
    lru = [("a", 10), ("b", 10), ("c", 10)]
    assert choose_evictions(30, 0, lru, set()) == []
    assert choose_evictions(30, 5, lru, set()) == ["a"]
    assert choose_evictions(30, 15, lru, {"a"}) == ["b", "c"]
    assert choose_evictions(10, 50, lru, {"a", "b", "c"}) == []


WARM = """
import sys
from pathlib import Path
from fnrt.loader.cache import BlobCache, CacheConfig
from fnrt.loader.retry import RetryPolicy
from fnrt.loader.stores.s3 import S3Config, S3Store

root, endpoint, digest = sys.argv[1:4]
store = S3Store("fnrt", "", S3Config(endpoint_url=endpoint, part_size_bytes=5 * 2**20))
print("go", flush=True)
sys.stdin.readline()
result = BlobCache(CacheConfig(Path(root))).get(
    digest, lambda tmp, written: store.download("blob", tmp, written=written)
)
print("fetched" if result.fetched else "hit", flush=True)
"""


def test_two_processes_warming_the_same_blob_download_it_once(
    s3: MotoEndpoint, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = os.urandom(12 * MiB)
    s3.store("fnrt").put("blob", data)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WARM, str(tmp_path / "cache"), proxy.url, digest_of(data)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        for _ in range(2)
    ]
    for p in procs:  # both are ready before either starts
        assert p.stdout is not None and p.stdout.readline().strip() == "go"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("\n")
        p.stdin.flush()
    outcomes = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outcomes == ["fetched", "hit"]
    assert proxy.gets(b"/fnrt/blob") == 3  # one download: three 5 MiB ranges
    assert (tmp_path / "cache" / "blobs" / digest_of(data)).read_bytes() == data


def test_the_budget_holds_from_the_start(tmp_path: Path) -> None:
    """A smaller --disk-cache-bytes than the folder holds trims it at start (was: only
    at the next fetch)."""
    cache = BlobCache(CacheConfig(tmp_path, budget_bytes=10_000))
    blobs = [bytes([i]) * 1000 for i in range(5)]
    for b in blobs:
        cache.get(digest_of(b), writer(b))
    smaller = BlobCache(CacheConfig(tmp_path, budget_bytes=2500))
    assert smaller.size_bytes <= 2500
    assert digest_of(blobs[-1]) in smaller and digest_of(blobs[0]) not in smaller
    assert len(list((tmp_path / "blobs").iterdir())) <= 2 * 2  # each blob and its .ok
