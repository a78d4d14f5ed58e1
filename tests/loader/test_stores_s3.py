"""S3Store against a real S3 endpoint (moto's server) over HTTP, with faults injected."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest
from s3support import FaultProxy, MotoEndpoint, MotoProcess

from fnrt.functions.errors import StoreError
from fnrt.functions.routing import Routing
from fnrt.loader.repository import Repository
from fnrt.loader.stores import (
    FileStore,
    KeyNotFound,
    PreconditionFailed,
    S3Config,
    S3Store,
    open_store,
)
from support import listed_in_pages

MiB = 1024 * 1024


def test_objects_and_conditional_writes(s3: MotoEndpoint) -> None:
    store = s3.store("fnrt", "team/a")
    etag = store.put("functions/f/routing.json", b"1", if_absent=True)
    assert store.get("functions/f/routing.json") == (b"1", etag)
    with pytest.raises(PreconditionFailed):
        store.put("functions/f/routing.json", b"2", if_absent=True)
    store.put("functions/f/routing.json", b"2", if_match=etag)
    with pytest.raises(PreconditionFailed):
        store.put("functions/f/routing.json", b"3", if_match=etag)
    store.put("blobs/sha256/x", b"blob")
    assert store.list("functions/") == ["functions/f/routing.json"]
    assert store.list("") == ["blobs/sha256/x", "functions/f/routing.json"]
    assert store.exists("blobs/sha256/x") and not store.exists("blobs/sha256/y")
    store.delete("blobs/sha256/x")
    with pytest.raises(KeyNotFound):
        store.get("blobs/sha256/x")
    assert store.local_path("functions/f/routing.json") is None


def test_multipart_upload_and_parallel_ranged_download(
    s3: MotoEndpoint, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = os.urandom(12 * MiB + 123)
    (tmp_path / "big").write_bytes(data)
    store = s3.store("fnrt", url=proxy.url)
    moved: list[int] = []
    store.put_file("big", tmp_path / "big", moved.append)
    assert sum(moved) == len(data)
    assert sum(1 for r in proxy.requests if r.startswith(b"PUT ") and b"partNumber" in r) == 3
    moved.clear()
    ranges: list[tuple[int, int]] = []
    store.download("big", tmp_path / "copy", moved.append, lambda a, b: ranges.append((a, b)))
    assert (tmp_path / "copy").read_bytes() == data
    assert sum(moved) == len(data)
    assert proxy.gets(b"/fnrt/big") == 3  # three 5 MiB ranges
    assert sorted(ranges) == [(0, 5 * MiB), (5 * MiB, 10 * MiB), (10 * MiB, len(data))]
    assert not [r for r in proxy.requests if r.startswith(b"HEAD ")]  # the first GET sized it


@pytest.mark.parametrize("size", [0, 1, 5 * MiB - 1, 5 * MiB, 5 * MiB + 1])
def test_download_sizes_the_object_from_its_first_range(
    s3: MotoEndpoint, proxy: FaultProxy, tmp_path: Path, size: int
) -> None:
    """Empty, smaller than a part, a part exactly, one byte over: the first ranged GET
    says the size, and the file is the object byte for byte."""
    data = os.urandom(size)
    s3.store("fnrt").put("obj", data)
    store = s3.store("fnrt", url=proxy.url)
    (tmp_path / "copy").write_bytes(b"stale bytes longer than some objects")
    store.download("obj", tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == data
    assert proxy.gets(b"/fnrt/obj") == max(1, -(-size // (5 * MiB)))
    with pytest.raises(KeyNotFound):
        store.download("missing", tmp_path / "none")


def test_transient_failures_are_retried(
    s3: MotoEndpoint, proxy: FaultProxy, tmp_path: Path
) -> None:
    data = os.urandom(7 * MiB)
    s3.store("fnrt").put("obj", data)
    store = s3.store("fnrt", url=proxy.url)
    proxy.set("cut", cut_after_bytes=1 * MiB, faults=1)  # the first response dies halfway
    store.download("obj", tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == data
    proxy.set("refuse", faults=2)
    assert store.get("obj")[0] == data


def test_a_final_failure_names_the_object(s3: MotoEndpoint, proxy: FaultProxy) -> None:
    store = s3.store("fnrt", url=proxy.url)
    proxy.set("refuse")
    with pytest.raises(StoreError, match=r"GET of s3://fnrt/blobs/sha256/abc failed after retries"):
        store.get("blobs/sha256/abc")
    assert proxy.connections >= 3


def test_repository_over_s3(s3: MotoEndpoint) -> None:
    repo = Repository(s3.store("fnrt", "prefix"))
    digest = hashlib.sha256(b"payload").hexdigest()
    assert repo.put_blob(digest, b"payload")
    assert not repo.put_blob(digest, b"payload")
    repo.update_routing("f", lambda _: Routing.first("v-1", "t"))
    repo.update_routing("f", lambda cur: cur.cut_over("v-2", "t"))  # type: ignore[union-attr]
    routing, _ = repo.get_routing("f")
    assert (routing.traffic, routing.previous) == ({"v-2": 100}, ("v-1",))
    assert repo.list_functions() == ["f"]


def test_functions_list_in_pages_over_s3_as_over_a_folder(s3: MotoEndpoint, tmp_path: Path) -> None:
    over_s3 = Repository(s3.store("fnrt", "paged"))
    on_disk = Repository(FileStore(tmp_path))
    for repo in (over_s3, on_disk):
        for name in ["a", "a-b", "a_c", "ab", "b", "b0", "z"]:
            repo.update_routing(name, lambda _: Routing.first("v-1", "t"))
    assert over_s3.list_functions() == on_disk.list_functions()
    for size in (1, 2, 3, 100):
        assert listed_in_pages(over_s3, size) == on_disk.list_functions()


def test_open_store_reads_s3_uris(s3: MotoEndpoint) -> None:
    from fnrt.loader.stores import S3Config

    store = open_store("s3://fnrt/some/prefix", S3Config(endpoint_url=s3.url))
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.uri) == (
        "fnrt",
        "some/prefix",
        "s3://fnrt/some/prefix",
    )
    with pytest.raises(ValueError, match="names no bucket"):
        open_store("s3:///x")


# --- a store that accepts connections and never answers (#41) --------------------------

#: Short bounds, so that a hang is seen in seconds: connect 0.5 s, read 1 s, 3 s in all.
HANG = {"connect_timeout_s": 0.5, "read_timeout_s": 1.0, "deadline_s": 3.0}
#: What a loaded test machine may add to a bound before the test calls it missed.
SLACK_S = 1.5


@pytest.fixture(scope="module")
def frozen_moto():  # type: ignore[no-untyped-def]
    """moto's server in its own process (to be frozen with SIGSTOP by a test)."""
    from s3support import CREDENTIALS, moto_process

    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    try:
        with moto_process() as moto:
            yield moto
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _bucket(moto: MotoProcess, name: str) -> S3Store:
    moto.thaw()
    moto.make_bucket(name)
    return moto.store(name, **HANG)


def test_a_connect_that_never_opens_fails_within_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from s3support import CREDENTIALS, unanswered_listener

    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)

    with unanswered_listener() as url:
        store = S3Store("fnrt", "", S3Config(endpoint_url=url, **HANG))  # type: ignore[arg-type]
        started = time.monotonic()
        with pytest.raises(StoreError) as caught:
            store.get("functions/f/routing.json")
        took = time.monotonic() - started
    assert took < HANG["deadline_s"] + SLACK_S, took  # was: 3 tries x 2 (botocore's own)
    assert caught.value.fields["store"] == "s3://fnrt"
    assert "ConnectTimeout" in caught.value.message, caught.value.message
    assert "s3://fnrt/functions/f/routing.json" in caught.value.message


def test_a_store_frozen_mid_download_fails_within_the_deadline(
    frozen_moto: MotoProcess, tmp_path: Path
) -> None:
    frozen_moto.thaw()
    frozen_moto.make_bucket("middownload")
    # parts larger than what the sockets' buffers hold: the freeze stops each part midway
    store = frozen_moto.store("middownload", **HANG, part_size_bytes=16 * MiB)
    data = os.urandom(32 * MiB + 1)
    store.put("blobs/sha256/big", data)
    froze: list[float] = []

    def progress(count: int) -> None:
        if not froze:  # the first MiB is in: the store stops answering
            frozen_moto.freeze()
            froze.append(time.monotonic())

    try:
        with pytest.raises(StoreError) as caught:
            store.download("blobs/sha256/big", tmp_path / "copy", progress)
        took = time.monotonic() - froze[0]
    finally:
        frozen_moto.thaw()
    assert took < HANG["deadline_s"] + SLACK_S, took
    assert "s3://middownload/blobs/sha256/big" in caught.value.message
    assert "ReadTimeout" in caught.value.message, caught.value.message
    assert store.get("blobs/sha256/big")[0] == data  # thawed: the store answers again


def test_a_store_frozen_during_a_conditional_write_fails_within_the_deadline(
    frozen_moto: MotoProcess,
) -> None:
    store = _bucket(frozen_moto, "casfreeze")
    repo = Repository(store)
    repo.update_routing("f", lambda _: Routing.first("v-1", "t"))
    froze: list[float] = []

    def change(current: Routing | None) -> Routing:
        assert current is not None
        frozen_moto.freeze()  # read, and now the write (If-Match) finds no answer
        froze.append(time.monotonic())
        return current.cut_over("v-2", "t")

    try:
        with pytest.raises(StoreError) as caught:
            repo.update_routing("f", change)
        took = time.monotonic() - froze[0]
    finally:
        frozen_moto.thaw()
    assert len(froze) == 1  # a store error is not a lost race: no second try
    assert took < HANG["deadline_s"] + SLACK_S, took
    assert caught.value.message.startswith("PUT of s3://casfreeze/functions/f/routing.json")
    assert caught.value.fields["store"] == "s3://casfreeze"


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="deadline_s: must be > 0"):
        S3Config(deadline_s=0)
    with pytest.raises(ValueError, match="read_timeout_s: must be > 0"):
        S3Config(read_timeout_s=0)


def test_botocore_makes_one_attempt_per_retry_of_ours(s3: MotoEndpoint) -> None:
    store = s3.store("fnrt")
    assert store.client.meta.config.retries["total_max_attempts"] == 1
