"""Weights changed on disk under a live instance that maps them are never served (#41)."""

from __future__ import annotations

import hashlib
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from s3support import MotoEndpoint

from fnrt.runtime.clock import ManualClock
from support import error_of, live_server, s3_registry, wait_until, write_function

X = {"x": [[1.0, 2.0, 3.0, 4.0]]}
WEIGHTS = bytes([7]) * (1 << 20)
DIGEST = hashlib.sha256(WEIGHTS).hexdigest()
RIGHT = {"y": [[8.0, 9.0, 10.0, 11.0]]}

#: Maps its weights (as torch's mmap=True and safetensors do): a write to the file
#: reaches the live instance.
MAPPED_HANDLER = """
import time
import numpy as np

class Mapped:
    def load(self, artifacts, device):
        self.w = np.memmap(artifacts["w"].path, dtype=np.uint8, mode="r")

    def __call__(self, batch):
        if batch[0]["x"][0, 0] < 0:  # a slow batch: the weights change while it runs
            time.sleep(1.0)
        return [{"y": r["x"] + float(self.w[0])} for r in batch]
"""

MAPPED_MANIFEST = """
name = "{name}"
handler = "handler:Mapped"

[artifacts]
w = "w.bin"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}

[isolation]
mode = "{mode}"
"""


def overwrite_in_place(path: Path, size: int = 16 * 1024) -> None:
    """The issue's repro: overwrite 16 KiB where it lies, then put the mtime back."""
    st = path.stat()
    os.chmod(path, 0o644)  # as its owner may (root needs not)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes([200]) * size, 0)
    finally:
        os.close(fd)
    os.chmod(path, st.st_mode)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _mapped(tmp_path: Path, mode: str) -> Path:
    manifest = MAPPED_MANIFEST.replace("{mode}", mode)
    return write_function(
        tmp_path / "src", "mapped", MAPPED_HANDLER, manifest, files={"w.bin": WEIGHTS}
    )


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_weights_changed_in_a_folder_store_are_never_served(tmp_path: Path, mode: str) -> None:
    folder = _mapped(tmp_path, mode)
    with live_server(tmp_path) as srv, srv.client() as c:
        srv.deploy(folder)
        assert c.post("/v1/functions/mapped/invoke", json=X).json() == RIGHT
        blob = tmp_path / "store" / "blobs" / "sha256" / DIGEST
        assert stat.S_IMODE(blob.stat().st_mode) == 0o444  # nobody but root writes to it
        overwrite_in_place(blob)
        r = c.post("/v1/functions/mapped/invoke", json=X)
        # was: 200 with y = x + 200, computed from the changed weights. Now the instance
        # is retired before the batch runs on it, and the reload refuses the blob.
        assert r.status_code == 500, r.text
        assert DIGEST in error_of(r)["error"] and "corrupt" in error_of(r)["error"]
        scheduler = srv.node.registry.loaded()[0]
        assert scheduler.stats.restarts["changed"] == 1
        assert c.get("/healthz").status_code == 200


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_batch_that_ends_after_its_weights_changed_is_not_served(
    tmp_path: Path, mode: str
) -> None:
    folder = _mapped(tmp_path, mode)
    with live_server(tmp_path, scrub_interval_s=3600) as srv, srv.client() as c:
        srv.deploy(folder)
        assert c.post("/v1/functions/mapped/invoke", json=X).json() == RIGHT
        scheduler = srv.node.registry.loaded()[0]
        slow = {"x": [[-1.0, 2.0, 3.0, 4.0]]}
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(c.post, "/v1/functions/mapped/invoke", json=slow)
            wait_until(lambda: scheduler.pool.running == 1)
            overwrite_in_place(tmp_path / "store" / "blobs" / "sha256" / DIGEST)
            r = answer.result()
        assert r.status_code == 503, r.text  # was: 200 with y = x + 200
        assert DIGEST in error_of(r)["error"] and "not served" in error_of(r)["error"]
        assert scheduler.stats.restarts["changed"] == 1


def test_the_scrub_retires_an_idle_instance_within_its_interval(tmp_path: Path) -> None:
    folder = _mapped(tmp_path, "thread")
    with live_server(tmp_path, scrub_interval_s=0.1) as srv, srv.client() as c:
        srv.deploy(folder)
        assert c.post("/v1/functions/mapped/invoke", json=X).json() == RIGHT
        scheduler = srv.node.registry.loaded()[0]
        assert scheduler.pool.instances == 1
        overwrite_in_place(tmp_path / "store" / "blobs" / "sha256" / DIGEST)
        # no request comes: the scrub finds it and the instance stops being used
        wait_until(lambda: scheduler.stats.restarts.get("changed") == 1, 5)
        wait_until(lambda: scheduler.pool.instances == 0, 5)  # its reload is refused: corrupt
        r = c.post("/v1/functions/mapped/invoke", json=X)
        assert r.status_code == 500 and DIGEST in error_of(r)["error"], r.text


def test_changed_weights_in_the_disk_cache_are_reloaded_from_the_store(
    tmp_path: Path, s3: MotoEndpoint
) -> None:
    from fnrt.runtime.cli.main import main

    folder = _mapped(tmp_path, "thread")
    argv = ["deploy", str(folder), "--store", "s3://fnrt/fns", "--s3-endpoint", s3.url, "-q"]
    assert main(argv) == 0
    node = s3_registry(tmp_path, s3.url, ManualClock())
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        r = c.post("/v1/functions/mapped/invoke", json=X)
        assert (r.json(), r.headers["x-fnrt-cold-start"]) == (RIGHT, "l3")
        cached = tmp_path / "cache" / "blobs" / DIGEST
        assert stat.S_IMODE(cached.stat().st_mode) == 0o444
        overwrite_in_place(cached)
        r = c.post("/v1/functions/mapped/invoke", json=X)
        # was: 200 with y = x + 200. Now the instance is retired before the batch runs
        # on it, and a new one maps a verified copy: fetched from the store again
        assert r.json() == RIGHT
        assert cached.read_bytes() == WEIGHTS
        assert srv.node.registry.loaded()[0].stats.restarts["changed"] == 1
