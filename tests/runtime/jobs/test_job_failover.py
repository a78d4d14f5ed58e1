"""A node killed mid-job (SIGKILL): another node finishes the job, every record once."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import orjson

from fnrt.client import Client
from fnrt.loader.repository import Repository
from fnrt.loader.stores import FileStore
from support import launch_serve, publish, serve_process, stop_serve, wait_serving, write_function

#: y = 2x, 15 ms a batch: a job of 40 chunks takes a few seconds on one node.
SLOW_HANDLER = """
import time

class Echo:
    def load(self, artifacts, device):
        pass

    def __call__(self, batch):
        time.sleep(0.015)
        return [{"y": r["x"] * 2} for r in batch]
"""


def _unfinished(job: Path) -> set[int]:
    """The chunks a node holds a lease on and has not finished."""
    leased = {int(p.name) for p in (job / "lease").glob("[0-9]*")}
    done = {int(p.name) for p in (job / "done").glob("[0-9]*")}
    return leased - done


FLAGS = ("--job-lease-s", "2", "--job-poll-interval-s", "0.1", "--no-request-log")


def test_a_killed_nodes_chunks_are_finished_by_another_exactly_once(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "src", "slow", handler=SLOW_HANDLER, max_batch_size=8)
    vm = publish(Repository(FileStore(tmp_path / "store")), folder)
    records = [{"x": [[float(i), 1.0, 2.0, 3.0]]} for i in range(2000)]
    first = launch_serve(tmp_path, *FLAGS)
    try:
        wait_serving(first)
        with Client(first.url) as fnrt:
            fnrt.deploy(vm)
            job = fnrt.submit_job("slow", records, chunk_records=50)
            folder = tmp_path / "store" / "jobs" / job["id"]
            deadline = time.monotonic() + 60
            while True:  # mid-job, and caught (stopped) holding a chunk it has not finished
                assert time.monotonic() < deadline
                if fnrt.job(job["id"])["progress"]["chunks_done"] >= 3:
                    first.proc.send_signal(signal.SIGSTOP)
                    held = _unfinished(folder)
                    if held:
                        break
                    first.proc.send_signal(signal.SIGCONT)
                time.sleep(0.01)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
    finally:
        stop_serve(first)
    second_store = ("--store", str(tmp_path / "store"))
    with (
        serve_process(tmp_path / "second", *FLAGS, *second_store) as second,
        Client(second.url) as fnrt,
    ):
        status = fnrt.wait_job(job["id"], poll_s=0.1, timeout_s=120)
        assert status["state"] == "done"
        assert status["progress"]["records_done"] == 2000
        assert status["progress"]["records_failed"] == 0
        results = list(fnrt.job_results(job["id"]))
    assert [r["index"] for r in results] == list(range(2000))
    for i, result in enumerate(results):
        assert result["outputs"]["y"].tolist() == [[2.0 * i, 2.0, 4.0, 6.0]], i
    done = {int(p.name): orjson.loads(p.read_bytes()) for p in (folder / "done").glob("[0-9]*")}
    assert sorted(done) == list(range(40))
    assert all(done[chunk]["attempt"] == 2 for chunk in held), (held, done)
    killed = str(first.proc.pid)
    assert all(done[chunk]["node"].rsplit("-", 2)[1] != killed for chunk in held)
    assert any(d["node"].rsplit("-", 2)[1] == killed for d in done.values())
