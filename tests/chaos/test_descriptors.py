"""1,100 slow connections against a server limited to 1,024 open files."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx

from fnrt.runtime.cli.main import main
from support import serve_process, write_function

SLOW_HEAD = b"POST /v1/functions/echo/invoke HTTP/1.1\r\nhost: t\r\n"  # and never the rest


def test_slow_connections_cannot_take_the_descriptors_the_store_needs(tmp_path: Path) -> None:
    with serve_process(tmp_path, "--log-level", "warning", nofile=1024) as server:
        folder = write_function(tmp_path / "src", "echo")
        assert main(["deploy", str(folder), "--server", server.url, "-q"]) == 0
        slow: list[socket.socket] = []
        try:
            for _ in range(1100):  # more than the server can hold open
                sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
                sock.sendall(SLOW_HEAD)
                slow.append(sock)
            statuses = []
            for i in range(40):  # each on a new connection: the store is read for the first
                with httpx.Client(base_url=server.url, timeout=30) as c:
                    r = c.post("/v1/functions/echo/invoke", json={"x": [[i, 1, 2, 3]]})
                    statuses.append(r.status_code)
            open_files = len(os.listdir(f"/proc/{server.proc.pid}/fd"))
        finally:
            for sock in slow:
                sock.close()
        assert statuses == [200] * 40  # was 39 of 40 failed (EMFILE reached the store)
        assert open_files < 1024 - 128  # the reserve stayed free
        assert "Too many open files" not in "".join(server.log)
