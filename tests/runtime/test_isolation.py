"""Process isolation through a live server: bad handlers fail alone, neighbours never notice.

One process-mode function segfaults, exits, hangs and allocates without bound
on request; each gets its clear error and its worker is restarted. Throughout,
a thread-mode and a process-mode neighbour answer a steady stream of calls
with zero failures.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from fnrt.runtime.node import build_node
from support import ISOLATED_MANIFEST as MANIFEST
from support import MISBEHAVING_HANDLER as HANDLER
from support import (
    LiveServer,
    error_of,
    live_server,
    node_settings,
    open_fds,
    publish,
    wait_until,
    write_function,
)


def _deploy(srv: LiveServer, tmp_path: Path, name: str, **fields: object) -> None:
    values = {"mode": "process", "timeout_s": 0, "memory_limit_bytes": 0, **fields}
    folder = write_function(tmp_path / "src", name, HANDLER, MANIFEST, **values)
    srv.deploy(folder)


def _call(c: httpx.Client, name: str, what: float) -> httpx.Response:
    return c.post(f"/v1/functions/{name}/invoke", json={"x": [[what, 1, 2, 3]]})


class Steady:
    """Calls to a neighbour from a thread until stopped; every answer is recorded."""

    def __init__(self, srv: LiveServer, name: str) -> None:
        self.name = name
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(srv,), daemon=True)
        self._thread.start()

    def _run(self, srv: LiveServer) -> None:
        with srv.client() as c:
            while not self._stop.is_set():
                r = _call(c, self.name, 10)
                self.statuses.append(r.status_code if r.json().get("y") == [[20, 2, 4, 6]] else -1)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(30)
        return self.statuses


def test_bad_handlers_fail_alone_and_their_workers_restart(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        _deploy(srv, tmp_path, "bad", timeout_s=1)
        # no short timeout here: a fresh VM faults new pages in at ~100 MB/s
        _deploy(srv, tmp_path, "hog", memory_limit_bytes=256 << 20)
        _deploy(srv, tmp_path, "calm-thread", mode="thread")
        _deploy(srv, tmp_path, "calm-process")
        assert _call(c, "bad", 10).status_code == 200
        assert _call(c, "hog", 10).status_code == 200
        neighbours = [Steady(srv, "calm-thread"), Steady(srv, "calm-process")]
        try:
            cases = [
                ("bad", 1, 500, "signal", "killed by SIGSEGV"),
                ("bad", 2, 500, "exit", "exited with code 1"),
                ("bad", 3, 504, "timeout", "ran past its timeout of 1 s"),
                ("hog", 4, 500, "memory", "passed isolation.memory_limit_bytes (256 MiB)"),
            ]
            for name, what, status, cause, words in cases:
                started = time.monotonic()
                r = _call(c, name, what)
                assert r.status_code == status, error_of(r)
                body = error_of(r)
                assert words in body["error"] and body["cause"] == cause, body
                assert body["error_id"]
                assert time.monotonic() - started < 20
                again = _call(c, name, 10)  # a new worker answers
                assert again.status_code == 200, error_of(again)
        finally:
            counts = [n.stop() for n in neighbours]
        for n, statuses in zip(neighbours, counts, strict=True):
            assert statuses and set(statuses) == {200}, (n.name, statuses)
        bad = c.get("/v1/functions/bad").json()["instance"]
        hog = c.get("/v1/functions/hog").json()["instance"]
        assert bad["isolation"] == hog["isolation"] == "process"
        assert bad["restarts"] == {"signal": 1, "exit": 1, "timeout": 1}
        assert hog["restarts"] == {"memory": 1}
        assert "memory" in hog["last_restart_reason"]
        metrics = c.get("/metrics").text
        for name, cause in (
            ("bad", "signal"),
            ("bad", "exit"),
            ("bad", "timeout"),
            ("hog", "memory"),
        ):
            assert (
                f'fnrt_instance_restarts_total{{cause="{cause}",function="{name}"}} 1.0' in metrics
            )
        assert c.get("/healthz").status_code == 200


def test_workers_that_die_leave_no_descriptors_or_arenas_open(tmp_path: Path) -> None:
    """A dead worker's arenas close with it: before, a worker frozen out of the
    collector after its load kept its four arenas mapped (/dev/shm memory) and their
    four descriptors after it died, until the next unload's collection."""
    with live_server(tmp_path, spare_workers=0) as srv, srv.client() as c:
        _deploy(srv, tmp_path, "dies")
        assert _call(c, "dies", 10).status_code == 200
        before = len(open_fds())
        for _ in range(4):
            assert _call(c, "dies", 2).status_code == 500  # its worker exits
            assert _call(c, "dies", 10).status_code == 200  # a new one answers
        assert len(open_fds()) <= before + 3  # less than one dead worker's arenas


def _workers() -> list[int]:
    """This process's worker processes (a live server runs in the test's process)."""
    found = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"fnrt.loader.worker" in cmdline:
                found.append(int(child))
    return found


def _dead(pid: int) -> bool:
    """Whether the worker ``pid`` (a child of this process: the live server runs in it)
    has ended. Not its state in /proc: that says "Z" as soon as its main thread
    exits, while its other threads may still be exiting and it cannot be waited for."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # waited for already
        return True


def test_a_worker_killed_while_idle_is_replaced_before_the_next_batch(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        _deploy(srv, tmp_path, "victim")
        assert _call(c, "victim", 10).status_code == 200
        (pid,) = _workers()
        os.kill(pid, signal.SIGKILL)  # an operator, or the OOM killer, while it idles
        deadline = time.monotonic() + 10
        while not _dead(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        r = _call(c, "victim", 10)  # served by a new worker, not failed with the old one
        assert r.status_code == 200, error_of(r)
        assert r.json()["y"] == [[20, 2, 4, 6]]
        instance = c.get("/v1/functions/victim").json()["instance"]
        assert instance["restarts"] == {"signal": 1}
        assert "SIGKILL" in instance["last_restart_reason"]
        assert _workers() != [pid]


def test_a_thread_handler_past_its_timeout_is_replaced(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        _deploy(srv, tmp_path, "slow", mode="thread", timeout_s=0.5)
        started = time.monotonic()
        r = _call(c, "slow", 3)
        assert r.status_code == 504, error_of(r)
        assert error_of(r)["cause"] == "timeout"
        assert time.monotonic() - started < 5
        assert _call(c, "slow", 10).status_code == 200  # a new instance, a new thread
        assert c.get("/v1/functions/slow").json()["instance"]["restarts"] == {"timeout": 1}


def test_a_handler_whose_load_crashes_fails_with_a_clear_error_and_backs_off(
    tmp_path: Path,
) -> None:
    crash_on_load = HANDLER.replace("self.hoard = []", "os._exit(3)")
    with live_server(tmp_path) as srv, srv.client() as c:
        folder = write_function(
            tmp_path / "src",
            "doomed",
            crash_on_load,
            MANIFEST,
            mode="process",
            timeout_s=0,
            memory_limit_bytes=0,
        )
        srv.deploy(folder)
        r = _call(c, "doomed", 10)
        assert r.status_code == 500, error_of(r)
        assert "failed to load" in error_of(r)["error"]
        assert "exited with code 3" in error_of(r)["error"]
        instance = c.get("/v1/functions/doomed").json()["instance"]
        assert instance["load_failures"] == 1 and instance["state"] == "cold"
        assert c.get("/healthz").status_code == 200


LEAKY = """
import os, threading, time
import numpy as np

class H:
    def __call__(self, batch):
        for _ in range(3):  # threads the handler never stops
            threading.Thread(target=time.sleep, args=(3600,)).start()
        return [{"y": np.full((1, 4), os.getpid(), dtype=np.float32)} for _ in batch]
"""


def test_threads_a_handler_leaks_end_with_its_worker(tmp_path: Path) -> None:
    folder = write_function(
        tmp_path / "src", "leaky", LEAKY, MANIFEST, mode="process", timeout_s=0,
        memory_limit_bytes=0,
    )  # fmt: skip
    with live_server(tmp_path) as srv, srv.client() as c:
        srv.deploy(folder)
        pid = int(_call(c, "leaky", 7).json()["y"][0][0])
        assert len(list(Path(f"/proc/{pid}/task").iterdir())) >= 4  # its leaked threads
        server_threads = set(threading.enumerate())
        assert c.post("/v1/functions/leaky/unload").json()["unloaded"]
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{pid}").exists()  # the worker, and every thread in it, is gone
        # none of them was the server's: its only new threads are its loop's executor's
        # (the unload ran on one, which may have started: uvloop_N)
        new = [t.name for t in threading.enumerate() if t not in server_threads]
        assert all(name.startswith(("uvloop_", "asyncio_")) for name in new), new


PLAIN = MANIFEST[: MANIFEST.index("[isolation]")]  # no [isolation]: the node decides


def _pid_of(c: httpx.Client, name: str) -> int:
    r = _call(c, name, 6)
    assert r.status_code == 200, error_of(r)
    return int(r.json()["y"][0][0])


@pytest.mark.parametrize("node_default", ["process", "thread"])
def test_a_manifest_without_isolation_runs_where_the_node_says(
    tmp_path: Path, node_default: str
) -> None:
    settings = {} if node_default == "process" else {"isolation": "thread"}  # process: default
    with live_server(tmp_path, **settings) as srv, srv.client() as c:
        plain = write_function(tmp_path / "src", "plain", HANDLER, PLAIN)
        srv.deploy(plain)
        _deploy(srv, tmp_path, "pinned", mode="thread")  # the manifest's mode wins
        capped = MANIFEST.replace('mode = "{mode}"\n', "")  # a memory limit needs a process
        folder = write_function(
            tmp_path / "src", "capped", HANDLER, capped, timeout_s=0, memory_limit_bytes=512 << 20
        )
        srv.deploy(folder)
        where = {
            name: "thread" if _pid_of(c, name) == os.getpid() else "process"
            for name in ("plain", "pinned", "capped")
        }
        assert where == {"plain": node_default, "pinned": "thread", "capped": "process"}
        for name, mode in where.items():
            assert c.get(f"/v1/functions/{name}").json()["instance"]["isolation"] == mode


def test_a_node_with_named_worker_imports_serves_its_first_cold_start_from_a_spare(
    tmp_path: Path,
) -> None:
    node = build_node(node_settings(tmp_path, worker_imports=("idna",)))
    spares = node.loader.spares
    assert spares is not None and spares.count == 1
    with live_server(tmp_path, node=node) as srv:
        wait_until(lambda: spares.ready == 1)
        (spare,) = spares._spares
        assert spare.imports == {"idna"}
        _deploy(srv, tmp_path, "p")  # answers with a spare ready for what its code imports
        (spare,) = spares._spares
        assert spare.imports >= {"idna"}
        with srv.client() as c:
            r = _call(c, "p", 6)  # answers its worker's pid
        assert r.status_code == 200, r.text
        assert r.json()["y"][0][0] == spare.process.pid
        assert spares.taken == 1
        wait_until(lambda: spares.ready == 1)  # replaced after the load
        (replacement,) = spares._spares
        with srv.client() as c:
            scraped = c.get("/metrics").text
        assert "fnrt_spare_workers 1.0" in scraped
        assert "fnrt_spare_workers_taken_total 1.0" in scraped
    # the node's close ended the spare it held, and the worker the spare became
    assert replacement.process.wait(10) is not None
    assert spare.process.wait(10) is not None


def test_a_node_started_again_on_its_cache_starts_the_spares_it_learned(tmp_path: Path) -> None:
    (tmp_path / "cache" / "spares").mkdir(parents=True)
    (tmp_path / "cache" / "spares" / "imports.json").write_text('["idna"]')
    node = build_node(node_settings(tmp_path))
    spares = node.loader.spares
    assert spares is not None
    with live_server(tmp_path, node=node):
        wait_until(lambda: spares.ready == 1)  # before any cold start
        (spare,) = spares._spares
        assert spare.imports == {"idna"}


#: The misbehaving handler, importing a package the worker itself never imports.
IMPORTING = "import idna\n" + HANDLER


def _importing(tmp_path: Path) -> Path:
    """A process-isolated function ``p`` whose code imports idna and numpy."""
    values = {"mode": "process", "timeout_s": 0, "memory_limit_bytes": 0}
    return write_function(tmp_path / "src", "p", IMPORTING, MANIFEST, **values)


def test_a_deploy_teaches_a_new_node_what_to_import_ahead_of_its_first_cold_start(
    tmp_path: Path,
) -> None:
    node = build_node(node_settings(tmp_path))  # a new cache: nothing learned yet
    spares = node.loader.spares
    assert spares is not None and not spares.known
    with live_server(tmp_path, node=node) as srv:
        folder = _importing(tmp_path)
        deployed = srv.deploy(folder)
        stored = node.repository.get_version("p", deployed.version)
        assert {"idna", "numpy"} <= set(stored.imports)
        wait_until(lambda: spares.ready == 1)  # no cold start yet: learned from the code
        (spare,) = spares._spares
        assert spare.imports == {"idna", "numpy"}  # fnrt_test_gates: not an installed package
        with srv.client() as c:
            r = _call(c, "p", 6)  # answers its worker's pid
        assert r.status_code == 200, r.text
        assert r.json()["y"][0][0] == spare.process.pid  # the first cold start took it


def test_a_node_started_on_a_store_learns_what_its_functions_import(tmp_path: Path) -> None:
    from fnrt.runtime.deployment import publish_version

    deploying = build_node(node_settings(tmp_path, spare_workers=0))  # fnrt deploy --store
    folder = _importing(tmp_path)
    publish_version(deploying.repository, deploying.loader, publish(deploying.repository, folder))
    node = build_node(replace(node_settings(tmp_path), cache_dir=tmp_path / "new-cache"))
    spares = node.loader.spares
    assert spares is not None and not spares.known
    with live_server(tmp_path, node=node):
        wait_until(lambda: spares.ready == 1)  # at the start, before any call
        (spare,) = spares._spares
        assert spare.imports == {"idna", "numpy"}


def test_a_node_whose_functions_run_in_threads_starts_no_spares_for_them(
    tmp_path: Path,
) -> None:
    node = build_node(node_settings(tmp_path, isolation="thread"))
    spares = node.loader.spares
    assert spares is not None
    with live_server(tmp_path, node=node) as srv:
        folder = write_function(tmp_path / "src", "t", IMPORTING, PLAIN)
        srv.deploy(folder)
        with srv.client() as c:
            assert _call(c, "t", 6).status_code == 200
        assert not spares.known and spares.ready == 0


def test_spare_workers_zero_starts_none(tmp_path: Path) -> None:
    assert build_node(node_settings(tmp_path, spare_workers=0)).loader.spares is None
