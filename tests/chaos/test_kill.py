"""SIGKILL in the middle of a deploy: nothing stored is lost, nothing is left behind."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx

from fnrt.runtime.cli.main import main
from support import serve_process, wait_until, write_function

CHUNK = b"w" * (1 << 20)


def test_a_node_killed_during_an_upload_restarts_clean(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "src", "echo")
    uploads = tmp_path / "cache" / "uploads"
    with serve_process(tmp_path, "--log-level", "warning") as server:
        assert main(["deploy", str(folder), "--server", server.url, "-q"]) == 0
        sent = threading.Event()

        def body() -> Iterator[bytes]:
            for i in range(200):  # 200 MB, never finished
                if i == 20:
                    sent.set()
                yield CHUNK

        digest = hashlib.sha256(CHUNK * 200).hexdigest()

        def upload() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the server is killed under it
                httpx.put(f"{server.url}/v1/blobs/{digest}", content=body(), timeout=30)

        uploading = threading.Thread(target=upload)
        uploading.start()
        assert sent.wait(30)
        wait_until(lambda: uploads.is_dir() and any(p.stat().st_size for p in uploads.iterdir()))
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        uploading.join(30)
    left = list(uploads.iterdir())
    assert left and sum(p.stat().st_size for p in left) > 0  # the spool a kill leaves
    with serve_process(tmp_path, "--log-level", "warning") as server:
        assert list(uploads.iterdir()) == []  # removed at start
        assert not list((tmp_path / "store").rglob("*.tmp"))
        r = httpx.post(f"{server.url}/v1/functions/echo/invoke", json={"x": [[1, 2, 3, 4]]})
        assert r.status_code == 200  # what was deployed before the kill still serves
        assert main(["deploy", str(folder), "--server", server.url, "-q"]) == 0
