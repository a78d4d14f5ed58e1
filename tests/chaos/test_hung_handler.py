"""A handler that never returns cannot hold an unload or a shutdown."""

from __future__ import annotations

import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from fnrt.runtime.cli.main import main
from support import MISBEHAVING_HANDLER, serve_process, wait_until, write_function

MANIFEST = """
name = "{name}"
handler = "handler:H"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}

[batching]
max_batch_size = 1
"""
HANG = {"x": [[3, 0, 0, 0]]}  # 3: the handler sleeps for an hour
FINE = {"x": [[7, 0, 0, 0]]}  # 7: it answers


def describe(url: str, name: str) -> dict:
    return httpx.get(f"{url}/v1/functions/{name}").json()


def test_unload_stops_a_batch_that_never_returns(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "src", "hangs", MISBEHAVING_HANDLER, manifest=MANIFEST)
    with serve_process(tmp_path, "--log-level", "warning") as server, ThreadPoolExecutor(2) as pool:
        assert main(["deploy", str(folder), "--server", server.url, "-q"]) == 0
        url = f"{server.url}/v1/functions/hangs"
        hung = pool.submit(httpx.post, f"{url}/invoke", json=HANG, timeout=60)
        wait_until(lambda: describe(server.url, "hangs")["instance"]["running"] == 1, 30)
        r = httpx.post(f"{url}/unload", params={"wait_s": 0}, timeout=30)
        assert r.json()["unloaded"] is True and r.json()["stopped_batches"] == 1  # was false
        answer = hung.result()
        assert answer.status_code == 503 and "retry" in answer.json()["error"]
        ok = httpx.post(f"{url}/invoke", json=FINE, timeout=30)
        assert ok.status_code == 200  # a new instance serves


def test_shutdown_ends_in_its_time_whatever_the_handler_does(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "src", "hangs", MISBEHAVING_HANDLER, manifest=MANIFEST)
    flags = ("--log-level", "warning", "--shutdown-timeout-s", "2")
    with serve_process(tmp_path, *flags) as server, ThreadPoolExecutor(2) as pool:
        assert main(["deploy", str(folder), "--server", server.url, "-q"]) == 0
        url = f"{server.url}/v1/functions/hangs/invoke"
        hung = pool.submit(httpx.post, url, json=HANG, timeout=60)
        wait_until(lambda: describe(server.url, "hangs")["instance"]["running"] == 1, 30)
        queued = pool.submit(httpx.post, url, json=FINE, timeout=60)
        # admitted: queued, or sent ahead into the worker's second arena (loader/process.py);
        # either way it waits behind the hung batch
        wait_until(lambda: describe(server.url, "hangs")["instance"]["requests"] == 2, 30)
        server.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        try:
            code = server.proc.wait(30)  # was: alive until SIGKILL
        except subprocess.TimeoutExpired:
            raise AssertionError("the server did not exit after SIGTERM") from None
        assert code == 0, "".join(server.log)[-2000:]
        assert time.monotonic() - started < 30
        assert hung.result().status_code == 503
        assert queued.result().status_code == 503  # cut off at shutdown: retryable, not 500


CRASHING = (
    MANIFEST
    + """
[isolation]
mode = "process"
restart_backoff_s = 0.05
max_backoff_s = 0.2

[breaker]
min_requests = 5
"""
)


def test_a_function_whose_instances_keep_dying_is_marked_failing(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "src", "crashes", MISBEHAVING_HANDLER, manifest=CRASHING)
    ok = write_function(tmp_path / "src", "fine", MISBEHAVING_HANDLER, manifest=MANIFEST)
    with serve_process(tmp_path, "--log-level", "warning") as server:
        for f in (folder, ok):
            assert main(["deploy", str(f), "--server", server.url, "-q"]) == 0
        statuses = []
        for _ in range(12):  # 1: every call segfaults its worker
            r = httpx.post(f"{server.url}/v1/functions/crashes/invoke", json={"x": [[1, 0, 0, 0]]})
            statuses.append(r.status_code)
            fine = httpx.post(f"{server.url}/v1/functions/fine/invoke", json=FINE)
            assert fine.status_code == 200  # its neighbour never notices
        assert set(statuses[:3]) == {500}  # the worker dies, is restarted, dies again
        assert statuses[-1] == 503  # then the circuit opens: a clear, fast 503
        last = httpx.post(f"{server.url}/v1/functions/crashes/invoke", json={"x": [[1, 0, 0, 0]]})
        assert "circuit" in last.json()["error"] and "retry-after" in last.headers
        described = describe(server.url, "crashes")["instance"]
        assert described["breaker"]["state"] == "open"
        assert described["restarts"]["signal"] >= 3
        assert "SIGSEGV" in described["last_restart_reason"]
