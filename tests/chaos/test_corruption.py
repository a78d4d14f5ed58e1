"""Weights changed in place, with their mtime restored, are never served."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from s3support import MotoEndpoint

from fnrt.runtime.clock import ManualClock
from support import (
    WEIGHTED_HANDLER,
    WEIGHTED_MANIFEST,
    live_server,
    publish,
    s3_registry,
    write_function,
)

X = {"x": [[1.0, 2.0, 3.0, 4.0]]}
WEIGHTS = bytes([7]) * (1 << 20)


def corrupt_in_place(path: Path) -> None:
    """Overwrite the first 4 KB, then put the size and mtime back as they were."""
    st = path.stat()
    with path.open("r+b") as f:
        f.write(bytes([200]) * 4096)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_corrupt_folder_store_blob_is_refused_naming_it(tmp_path: Path) -> None:
    folder = write_function(
        tmp_path / "src", "weighted", WEIGHTED_HANDLER, WEIGHTED_MANIFEST, files={"w.bin": WEIGHTS}
    )
    digest = hashlib.sha256(WEIGHTS).hexdigest()
    with live_server(tmp_path) as srv, srv.client() as c:
        srv.deploy(folder)
        assert c.post("/v1/functions/weighted/invoke", json=X).json() == {"y": [[8, 9, 10, 11]]}
        assert c.post("/v1/functions/weighted/unload").json()["unloaded"]
        corrupt_in_place(tmp_path / "store" / "blobs" / "sha256" / digest)
        r = c.post("/v1/functions/weighted/invoke", json=X)
        assert r.status_code == 500  # was 200 with outputs near 1e25
        assert digest in r.json()["error"] and "corrupt" in r.json()["error"]


def test_a_corrupt_disk_cache_blob_is_fetched_again(tmp_path: Path, s3: MotoEndpoint) -> None:
    from fnrt.runtime.cli.main import main

    folder = write_function(
        tmp_path / "src", "weighted", WEIGHTED_HANDLER, WEIGHTED_MANIFEST, files={"w.bin": WEIGHTS}
    )
    argv = ["deploy", str(folder), "--store", "s3://fnrt/fns", "--s3-endpoint", s3.url, "-q"]
    assert main(argv) == 0
    digest = hashlib.sha256(WEIGHTS).hexdigest()
    node = s3_registry(tmp_path, s3.url, ManualClock())
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        r = c.post("/v1/functions/weighted/invoke", json=X)
        assert (r.json(), r.headers["x-fnrt-cold-start"]) == ({"y": [[8, 9, 10, 11]]}, "l3")
        assert c.post("/v1/functions/weighted/unload").json()["unloaded"]
        cached = tmp_path / "cache" / "blobs" / digest
        corrupt_in_place(cached)
        r = c.post("/v1/functions/weighted/invoke", json=X)
        assert r.json() == {"y": [[8, 9, 10, 11]]}  # fetched again from the store
        assert r.headers["x-fnrt-cold-start"] == "l3"
        assert cached.read_bytes() == WEIGHTS


def test_code_edited_in_the_cache_is_unpacked_again(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "src", "echo")
    with live_server(tmp_path) as srv, srv.client() as c:
        vm = publish(srv.node.repository, folder)
        srv.call(srv.node.deployer.deploy(vm))
        assert c.post("/v1/functions/echo/invoke", json=X).json() == {"y": [[2, 4, 6, 8]]}
        assert c.post("/v1/functions/echo/unload").json()["unloaded"]
        handler = tmp_path / "cache" / "code" / vm.bundle.digest / "handler.py"
        st = handler.stat()
        handler.write_text(handler.read_text().replace("* self.scale", "* 1000"))
        os.utime(handler, ns=(st.st_atime_ns, st.st_mtime_ns))
        r = c.post("/v1/functions/echo/invoke", json=X)
        assert r.json() == {"y": [[2, 4, 6, 8]]}  # was: the edited code ran
        assert "* 1000" not in handler.read_text()
