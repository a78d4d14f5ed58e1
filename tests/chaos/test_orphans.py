"""Processes a handler starts end with its worker: at an unload, a crash, and the node's exit.

The handler starts real processes four ways: ``subprocess.Popen(["sleep", ...])``
(in the worker's process group), ``setsid sleep`` (a session of its own, out of
that group), ``os.fork()`` (a copy of the worker), and ``sh -c "setsid sleep &"``
(orphaned at once: its parent shell exits). Each sleeps for ten minutes with a
duration unique to the test, so the test finds them in ``/proc`` wherever they
were reparented. None may be left once the worker is gone.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import httpx
import pytest

from fnrt.runtime.cli.main import main
from support import error_of, live_server, serve_process, wait_until, write_function

SPAWNER = """
import ctypes, os, subprocess, time
import numpy as np

class H:
    def __call__(self, batch):
        what = int(batch[0]["x"][0, 0])
        if what == 1:
            ctypes.string_at(0)
        subprocess.Popen(["sleep", "{marker}1"])
        subprocess.Popen(["setsid", "sleep", "{marker}2"])
        subprocess.Popen(["sh", "-c", "setsid sleep {marker}3 &"]).wait()
        child = os.fork()
        if child == 0:
            time.sleep(600)
            os._exit(0)
        return [{{"y": np.full((1, 4), child, dtype=np.float32)}} for _ in batch]
"""

MANIFEST = """
name = "{name}"
handler = "handler:H"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 4] }}

[isolation]
mode = "process"
restart_backoff_s = 0.05
"""
SPAWN = {"x": [[0, 0, 0, 0]]}
CRASH = {"x": [[1, 0, 0, 0]]}


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie holds nothing: it only waits to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _sleepers(marker: str) -> set[int]:
    """The running ``sleep`` processes whose duration starts with ``marker``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = len(argv) >= 2 and argv[0].endswith(b"sleep") and argv[1].startswith(marker.encode())
        if ours and _running(int(entry.name)):
            found.add(int(entry.name))
    return found


def _spawner(tmp_path: Path) -> tuple[Path, str]:
    marker = f"600.{random.randrange(10**8):08d}"
    folder = write_function(tmp_path / "src", "spawner", SPAWNER.format(marker=marker), MANIFEST)
    return folder, marker


def _spawned(c: httpx.Client, marker: str) -> set[int]:
    """Call the handler; every process it started (three sleeps and a fork)."""
    r = c.post("/v1/functions/spawner/invoke", json=SPAWN)
    assert r.status_code == 200, error_of(r)
    forked = int(r.json()["y"][0][0])
    wait_until(lambda: len(_sleepers(marker)) == 3)
    started = _sleepers(marker) | {forked}
    assert all(_running(pid) for pid in started)
    return started


def _all_gone(pids: set[int]) -> None:
    try:
        wait_until(lambda: not any(_running(pid) for pid in pids), 10)
    finally:  # a failing test leaves no ten-minute sleepers behind either
        for pid in pids:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def test_an_unload_ends_what_the_handler_started(tmp_path: Path) -> None:
    folder, marker = _spawner(tmp_path)
    with live_server(tmp_path) as srv, srv.client() as c:
        srv.deploy(folder)
        started = _spawned(c, marker)
        assert c.post("/v1/functions/spawner/unload").json()["unloaded"]
        _all_gone(started)


def test_a_worker_that_crashes_takes_what_its_handler_started_with_it(tmp_path: Path) -> None:
    folder, marker = _spawner(tmp_path)
    with live_server(tmp_path) as srv, srv.client() as c:
        srv.deploy(folder)
        started = _spawned(c, marker)
        r = c.post("/v1/functions/spawner/invoke", json=CRASH)
        assert r.status_code == 500 and error_of(r)["cause"] == "signal"
        _all_gone(started)
        again = _spawned(c, marker)  # the restarted worker serves, and starts its own
        assert not again & started
        assert c.post("/v1/functions/spawner/unload").json()["unloaded"]
        _all_gone(again)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_nothing_a_handler_started_outlives_the_node(tmp_path: Path, how: signal.Signals) -> None:
    folder, marker = _spawner(tmp_path)
    with serve_process(tmp_path, "--log-level", "warning") as server:
        assert main(["deploy", str(folder), "--server", server.url, "-q"]) == 0
        with httpx.Client(base_url=server.url, timeout=30) as c:
            started = _spawned(c, marker)
        os.kill(server.proc.pid, how)
        server.proc.wait(30)
        _all_gone(started)
