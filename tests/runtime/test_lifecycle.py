"""A node that is safe to start, stop and kill: what ``/readyz`` and the socket say."""

from __future__ import annotations

import json
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from fnrt.functions.routing import Routing
from fnrt.loader.repository import Repository
from fnrt.loader.stores import FileStore
from fnrt.runtime.cli.main import main
from support import gate, live_server, publish, serve_process, wait_until, write_function

SLOW_LOAD = """
import fnrt_test_gates

class Slow:
    def load(self, artifacts, device):
        fnrt_test_gates.gate("load").wait(30)

    def __call__(self, batch):
        return [{"y": r["x"]} for r in batch]
"""

AT_START = """
name = "{name}"
handler = "handler:Slow"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}

[scaling]
load_at_start = true
"""


def test_ready_only_once_what_loads_at_start_is_warm(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "src", "early", SLOW_LOAD, AT_START)
    repository = Repository(FileStore(tmp_path / "store"))  # deployed before the node starts
    vm = publish(repository, folder)
    repository.put_version(vm)
    repository.update_routing("early", lambda _: Routing({vm.version: 100}))
    with live_server(tmp_path) as srv, srv.client() as c:
        r = c.get("/readyz")
        assert r.status_code == 503 and r.json()["status"] == "starting"
        assert "1 function(s) that load at start are still loading" in r.json()["error"]
        assert c.get("/v2/health/ready").status_code == 503  # the OIP probe says the same
        assert c.get("/healthz").status_code == 200  # alive all along
        gate("load").set()
        wait_until(lambda: c.get("/readyz").status_code == 200)
        assert c.get("/readyz").json() == {"status": "ready"}


ECHO = {"x": [[1.0, 2.0, 3.0, 4.0]]}


def _refused(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return True
    return False


def test_sigterm_unready_at_once_then_serves_through_the_drain_delay(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "src", "echo")
    flags = ("--log-level", "warning", "--drain-delay-s", "2", "--shutdown-timeout-s", "5")
    with serve_process(tmp_path, *flags) as server, httpx.Client(base_url=server.url) as c:
        assert main(["deploy", str(folder), "--server", server.url, "-q"]) == 0
        assert c.post("/v1/functions/echo/invoke", json=ECHO).status_code == 200  # kept alive
        assert c.get("/readyz").status_code == 200
        server.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        wait_until(lambda: c.get("/readyz").status_code == 503, 1)
        assert c.get("/readyz").json()["status"] == "draining"
        r = c.post("/v1/functions/echo/invoke", json=ECHO)  # still served while endpoints update
        assert r.status_code == 200
        assert r.headers["connection"] == "close"  # and the client is told to go elsewhere
        with httpx.Client(base_url=server.url) as fresh:  # a new connection is still accepted
            assert fresh.post("/v1/functions/echo/invoke", json=ECHO).status_code == 200
        assert time.monotonic() - started < 2
        wait_until(lambda: _refused(server.url), 10)
        assert time.monotonic() - started >= 1.9  # not before the delay
        assert server.proc.wait(15) == 0
    history = tmp_path / "cache" / "prewarm" / "history.json"  # saved on the way out
    assert "echo" in json.loads(history.read_text())["functions"]


def test_requests_accepted_before_sigterm_all_finish(tmp_path: Path) -> None:
    # Clients keep calling the node itself (no load balancer drops it): all they send
    # until it stops accepting is answered 200. After that, connecting is refused, or
    # a connection the kernel had queued but the server never read is reset.
    folder = write_function(tmp_path / "src", "echo")
    flags = ("--log-level", "warning", "--drain-delay-s", "0.5")
    with serve_process(tmp_path, *flags) as server:
        assert main(["deploy", str(folder), "--server", server.url, "-q"]) == 0
        url = f"{server.url}/v1/functions/echo/invoke"
        assert httpx.post(url, json=ECHO).status_code == 200
        stop_accepting_at = [float("inf")]

        def client(_: int) -> list[int]:
            statuses = []
            with httpx.Client() as c:
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    sent = time.monotonic()
                    try:
                        statuses.append(c.post(url, json=ECHO).status_code)
                    except httpx.ConnectError:
                        return statuses  # refused: the node stopped accepting
                    except (httpx.RemoteProtocolError, httpx.ReadError):
                        assert sent >= stop_accepting_at[0], "a request cut off while serving"
                        return statuses
            return statuses

        with ThreadPoolExecutor(8) as pool:
            running = [pool.submit(client, i) for i in range(8)]
            time.sleep(0.5)
            server.proc.send_signal(signal.SIGTERM)
            stop_accepting_at[0] = time.monotonic() + 0.45  # the drain delay, less a margin
            answered = [s for f in running for s in f.result()]
        assert answered and set(answered) == {200}  # nothing accepted failed
        assert server.proc.wait(15) == 0


def test_draining_follows_the_phase() -> None:
    """``draining`` (read by every request, a field) is true from the stop on, and only
    then."""
    from fnrt.runtime.lifecycle import Lifecycle, Phase

    lifecycle = Lifecycle()
    assert not lifecycle.draining
    lifecycle.started()
    assert lifecycle.phase is Phase.READY and not lifecycle.draining
    lifecycle.drain()
    assert lifecycle.phase is Phase.DRAINING and lifecycle.draining
    lifecycle.stopped()
    lifecycle.drain()  # (a second signal after the stop changes nothing)
    assert lifecycle.phase is Phase.STOPPED and lifecycle.draining
