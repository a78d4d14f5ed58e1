from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fnrt.functions.errors import BlobNotFound, FunctionNotFound, IntegrityError, VersionNotFound
from fnrt.functions.routing import Routing
from fnrt.loader.repository import Repository
from fnrt.loader.stores import FileStore
from support import listed_in_pages, packed, write_function


def test_blobs_are_verified_while_written(tmp_path: Path) -> None:
    repo = Repository(FileStore(tmp_path))
    digest = hashlib.sha256(b"hello").hexdigest()
    with pytest.raises(IntegrityError):
        repo.put_blob(digest, b"olleh")
    assert not repo.has_blob(digest)
    assert repo.put_blob(digest, [b"he", b"llo"]) is True
    assert repo.put_blob(digest, b"hello") is False
    assert repo.read_blob(digest) == b"hello"
    with pytest.raises(BlobNotFound):
        repo.read_blob("0" * 64)


def test_versions_and_layout(tmp_path: Path) -> None:
    repo = Repository(FileStore(tmp_path / "store"))
    vm, bundle = packed(write_function(tmp_path, "echo"))
    with pytest.raises(BlobNotFound):
        repo.put_version(vm)  # blobs first
    for ref, source in bundle.blob_sources():
        repo.put_blob(ref.digest, source)
    assert repo.put_version(vm) is True
    assert repo.put_version(vm) is False
    assert repo.get_version("echo", vm.version) == vm
    assert repo.list_versions("echo") == [vm.version]
    assert (tmp_path / "store" / "functions" / "echo" / "versions" / f"{vm.version}.json").is_file()
    assert (tmp_path / "store" / "blobs" / "sha256" / vm.bundle.digest).is_file()
    with pytest.raises(VersionNotFound):
        repo.get_version("echo", "v-000000000000")
    # what a client may name in a header or a path: refused before any read (a name past
    # the file system's limit was an OSError, a 500)
    reads = repo.store.requests["GetObject"]
    for odd in ("x" * 3000, "../../routing", "a/b", "", ".hidden", "v 1"):
        with pytest.raises(VersionNotFound):
            repo.get_version("echo", odd)
    assert repo.store.requests["GetObject"] == reads


def test_concurrent_routing_updates_all_land(tmp_path: Path) -> None:
    repo = Repository(FileStore(tmp_path))
    repo.update_routing("f", lambda _: Routing.first("v-0", "t"))

    def deploy(i: int) -> None:
        repo.update_routing("f", lambda cur: cur.cut_over(f"v-{i}", "t"))  # type: ignore[union-attr]

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(deploy, range(1, 13)))
    routing, _ = repo.get_routing("f")
    seen = {*routing.traffic, *routing.previous}
    assert seen == {f"v-{i}" for i in range(13)}  # no update was lost
    assert sum(routing.traffic.values()) == 100
    assert repo.list_functions() == ["f"]
    repo.delete_function("f")
    with pytest.raises(FunctionNotFound):
        repo.get_routing("f")


NAMES = ["a", "a-b", "a_c", "ab", "b", "b0", "z"]


def test_functions_list_in_pages_in_the_stores_key_order(tmp_path: Path) -> None:
    repo = Repository(FileStore(tmp_path))
    for name in NAMES:
        repo.update_routing(name, lambda _: Routing.first("v-1", "t"))
    everything = repo.list_functions()
    assert sorted(everything) == sorted(NAMES)
    assert everything == sorted(NAMES, key=lambda n: n + "/")  # "a-b/" before "a/", as S3
    for size in (1, 2, 3, 7, 100):
        assert listed_in_pages(repo, size) == everything
    repo.delete_function("a_c")  # its folder stays (versions gone, routing gone): not listed
    assert "a_c" not in repo.list_functions() and "a_c" not in listed_in_pages(repo, 2)
    store = repo.store
    assert isinstance(store, FileStore)
    before = store.requests["ListObjectsV2"]
    repo.list_functions("", 2)
    assert store.requests["ListObjectsV2"] - before == 1  # one listing per page
