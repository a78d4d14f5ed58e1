"""The job runner alone: no server. Its real neighbours: a job board on a folder store
and a real scheduler of a small handler in a thread; the registry is a small fake (the
one version the job pinned)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, cast

import numpy as np

from fnrt.functions.errors import NotFound, StoreError
from fnrt.functions.handler import Request
from fnrt.functions.manifest import IsolationMode
from fnrt.functions.version import VersionManifest
from fnrt.loader.instance import Instance
from fnrt.loader.stores import FileStore
from fnrt.runtime import scheduler as sched
from fnrt.runtime.clock import SystemClock
from fnrt.runtime.jobs.board import JobBoard, JobSpec, JobState, new_id
from fnrt.runtime.jobs.runner import JobConfig, JobRunner
from fnrt.runtime.scheduler import Scheduler
from support import packed, write_function

MANIFEST = """
name = "{name}"
handler = "handler:Echo"

[batching]
max_batch_size = 4
max_wait_ms = 0
"""


class Pinned:
    """The registry as the runner sees it: one version of one function."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    async def get_version(self, function: str, version: str, *, fresh: bool = False) -> Scheduler:
        assert fresh  # a job's chunk reads the store whatever a request's 404 noted
        if (function, version) != (self.scheduler.name, self.scheduler.version.version):
            raise NotFound(f"function '{function}' has no version {version}")
        return self.scheduler


#: a record of 0.25 waits for it to be set (a chunk computing for long)
SLOW = threading.Event()


def _triple_unless_negative(batch: list[Request]) -> Sequence[Any]:
    if any(float(r["x"][0, 0]) == 0.25 for r in batch):
        SLOW.wait(10)
    if any(float(r["x"][0, 0]) < 0 for r in batch):
        raise ValueError("negative")
    return [{"y": r["x"] * 3} for r in batch]


def _load(vm: VersionManifest, executor: Executor) -> Instance:
    """A real instance of the handler above, in the executor's thread."""
    return Instance(vm, _triple_unless_negative, executor, None, {"total_s": 0.0}, 100)


def test_a_job_runs_in_blocks_and_a_failing_record_fails_alone(tmp_path: Path) -> None:
    vm = packed(write_function(tmp_path / "src", "echo", manifest=MANIFEST))[0]
    board = JobBoard(FileStore(tmp_path / "store"), "node-a", time.time)
    values = [float(i) for i in range(10)]
    values[6] = -1.0  # its block fails; tried alone, only it fails again
    spec = JobSpec(new_id(time.time()), "echo", vm.version, len(values), 5, time.time())
    board.create(spec, [{"x": np.full((1, 4), v, np.float32)} for v in values])

    async def scenario() -> None:
        scheduler = Scheduler(vm, _load, SystemClock(), isolation=IsolationMode.THREAD)
        scheduler.protection.outcomes.watch()  # as a rollout does: kept
        config = JobConfig(poll_interval_s=0.02, record_retries=1)
        runner = JobRunner(board, Pinned(scheduler), config, lambda: True)  # type: ignore[arg-type]
        runner.start()
        give_up = time.monotonic() + 30
        while not board.status(spec.id).state.state.final and time.monotonic() < give_up:
            await asyncio.sleep(0.02)
        await runner.close()
        # job records never count for the breaker: they did not pass the gateway
        assert scheduler.protection.outcomes.summary(0.0).requests == 0
        assert scheduler.stats.errors >= 2  # the failed block, then the record alone
        await sched.close(scheduler)

    asyncio.run(scenario())
    status = board.status(spec.id)
    assert status.state.state is JobState.DONE
    assert (status.records_done, status.records_failed) == (10, 1)
    results = board.chunk_results(spec.id, 0) + board.chunk_results(spec.id, 1)
    for value, result in zip(values, results, strict=True):
        if value < 0:
            assert "ValueError: negative" in result["error"]["message"]
        else:
            assert float(np.asarray(result["outputs"]["y"]).ravel()[0]) == value * 3


def test_closing_the_runner_as_it_is_woken_stops_it(tmp_path: Path) -> None:
    """close() in the same turn as a wake (a chunk ending, a job posted): the runner's
    loop stops (on Python 3.11 ``asyncio.wait_for`` swallowed that cancellation, and
    close() waited forever: a CI run hung on it)."""
    board = JobBoard(FileStore(tmp_path / "store"), "node-a", time.time)

    async def scenario() -> None:
        config = JobConfig(poll_interval_s=10.0)
        runner = JobRunner(board, Pinned(cast(Any, None)), config, lambda: True)  # type: ignore[arg-type]
        runner.start()
        await asyncio.sleep(0.1)  # it found nothing queued and waits for a wake
        runner.poke()
        closing = asyncio.ensure_future(runner.close())
        done, _ = await asyncio.wait({closing}, timeout=5.0)  # (wait_for would cancel it)
        assert closing in done, "close() did not return: the runner's loop runs on"

    asyncio.run(scenario())


def _until_final(board: JobBoard, vm: VersionManifest, job: str, wait_s: float = 10) -> None:
    """Run the runner on ``vm`` until ``job`` has ended (or ``wait_s``)."""

    async def scenario() -> None:
        scheduler = Scheduler(vm, _load, SystemClock(), isolation=IsolationMode.THREAD)
        config = JobConfig(poll_interval_s=0.02)
        runner = JobRunner(board, Pinned(scheduler), config, lambda: True)  # type: ignore[arg-type]
        runner.start()
        give_up = time.monotonic() + wait_s
        while not board.status(job).state.state.final and time.monotonic() < give_up:
            await asyncio.sleep(0.02)
        await runner.close()
        await sched.close(scheduler)

    asyncio.run(scenario())


def test_a_queued_job_removed_from_the_store_stops_no_other_job(tmp_path: Path) -> None:
    """Its folder removed by hand while it was queued (the queue entry left): forgotten,
    and the jobs queued after it run."""
    vm = packed(write_function(tmp_path / "src", "echo", manifest=MANIFEST))[0]
    store = FileStore(tmp_path / "store")
    board = JobBoard(store, "node-a", time.time)
    old = JobSpec(new_id(time.time() - 60), "echo", vm.version, 2, 1, time.time() - 60)
    board.create(old, [{"x": np.ones((1, 4), np.float32)} for _ in range(2)])
    for key in store.list(f"jobs/{old.id}/"):
        store.delete(key)
    new = JobSpec(new_id(time.time()), "echo", vm.version, 2, 1, time.time())
    board.create(new, [{"x": np.ones((1, 4), np.float32)} for _ in range(2)])
    _until_final(board, vm, new.id)
    assert board.status(new.id).state.state is JobState.DONE
    assert board.queued() == []  # the removed job's entry too


class FailsOneRenewal(FileStore):
    """A store whose first lease renewal fails (a transient error of the store's)."""

    renewals = 0

    def put(self, key: str, data: bytes, **kwargs: Any) -> str:  # type: ignore[override]
        if "/lease/" in key and kwargs.get("if_match") and b'"until_unix_s": 0.0' not in data:
            self.renewals += 1
            if self.renewals == 1:
                raise StoreError("503 SlowDown")
        return super().put(key, data, **kwargs)


def test_a_failed_lease_renewal_is_tried_again(tmp_path: Path) -> None:
    """One renewal the store refused: the chunk's lease is still renewed while its node
    computes, so no other node takes it and runs it again."""
    vm = packed(write_function(tmp_path / "src", "echo", manifest=MANIFEST))[0]
    store = FailsOneRenewal(tmp_path / "store")
    board = JobBoard(store, "node-a", time.time)
    spec = JobSpec(new_id(time.time()), "echo", vm.version, 1, 1, time.time())
    board.create(spec, [{"x": np.full((1, 4), 0.25, np.float32)}])  # computing until SLOW
    SLOW.clear()

    async def scenario() -> None:
        scheduler = Scheduler(vm, _load, SystemClock(), isolation=IsolationMode.THREAD)
        runner = JobRunner(board, Pinned(scheduler), JobConfig(lease_s=0.6), lambda: True)  # type: ignore[arg-type]
        runner.start()
        await asyncio.sleep(1.5)
        lease = board.lease(spec.id, 0)
        assert store.renewals >= 2  # the one refused, then more
        assert lease is not None and lease.until_unix_s > time.time() and lease.attempt == 1
        SLOW.set()
        give_up = time.monotonic() + 10
        while not board.status(spec.id).state.state.final and time.monotonic() < give_up:
            await asyncio.sleep(0.02)
        await runner.close()
        await sched.close(scheduler)

    asyncio.run(scenario())
    assert board.status(spec.id).state.state is JobState.DONE


DEADLINE_MANIFEST = MANIFEST + "\n[requests]\ntimeout_ms = 200\n"


def test_records_tried_alone_have_no_deadline_under_live_load(tmp_path: Path) -> None:
    """The function's timeout is for live requests: a job's records tried alone after
    their block failed wait behind live traffic for their turn, whatever it says (they
    failed with DeadlineExceeded, each of them, the good ones too)."""
    vm = packed(write_function(tmp_path / "src", "echo", manifest=DEADLINE_MANIFEST))[0]
    board = JobBoard(FileStore(tmp_path / "store"), "node-a", time.time)
    values = [1.0, -1.0, 2.0, 3.0]  # the block fails, each record tried alone
    spec = JobSpec(new_id(time.time()), "echo", vm.version, 4, 4, time.time())
    board.create(spec, [{"x": np.full((1, 4), v, np.float32)} for v in values])

    failed = threading.Event()  # the block failed: live traffic comes now

    def busy(batch: list[Request]) -> Sequence[Any]:
        time.sleep(0.01)  # a batch takes a while: live traffic keeps the slot busy
        if any(float(r["x"][0, 0]) < 0 for r in batch):
            failed.set()
        return _triple_unless_negative(batch)

    async def scenario() -> None:
        scheduler = Scheduler(
            vm,
            lambda vm, ex: Instance(vm, busy, ex, None, {"total_s": 0.0}, 100),
            SystemClock(),
            isolation=IsolationMode.THREAD,
        )
        config = JobConfig(poll_interval_s=0.02)
        runner = JobRunner(board, Pinned(scheduler), config, lambda: True)  # type: ignore[arg-type]

        async def live() -> None:  # normal priority, ahead of the job's records, for 2 s
            while not failed.is_set():
                await asyncio.sleep(0.005)
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                await sched.submit(scheduler, {"x": np.ones((1, 4), np.float32)})

        users = [asyncio.create_task(live()) for _ in range(8)]
        runner.start()
        give_up = time.monotonic() + 20
        while not board.status(spec.id).state.state.final and time.monotonic() < give_up:
            await asyncio.sleep(0.02)
        await runner.close()
        await asyncio.gather(*users, return_exceptions=True)
        await sched.close(scheduler)

    asyncio.run(scenario())
    results = board.chunk_results(spec.id, 0)
    assert "ValueError: negative" in results[1]["error"]["message"]
    assert [float(results[i]["outputs"]["y"][0, 0]) for i in (0, 2, 3)] == [3.0, 6.0, 9.0]


class FailsOneStateWrite(FileStore):
    """A store whose first write of a job's state after its creation fails (transient)."""

    failed = False

    def put(self, key: str, data: bytes, **kwargs: Any) -> str:  # type: ignore[override]
        if key.endswith("/state.json") and kwargs.get("if_match") and not self.failed:
            self.failed = True
            raise StoreError("503 SlowDown")
        return super().put(key, data, **kwargs)


def test_a_job_whose_start_could_not_be_written_runs_once_it_can(tmp_path: Path) -> None:
    """Marking the job running failed (the store, for a moment): the chunk just taken
    is given back at once, no attempt counted, and the job is marked and run later."""
    vm = packed(write_function(tmp_path / "src", "echo", manifest=MANIFEST))[0]
    store = FailsOneStateWrite(tmp_path / "store")
    board = JobBoard(store, "node-a", time.time)
    spec = JobSpec(new_id(time.time()), "echo", vm.version, 2, 1, time.time())
    board.create(spec, [{"x": np.ones((1, 4), np.float32)} for _ in range(2)])
    _until_final(board, vm, spec.id)
    status = board.status(spec.id)
    assert store.failed and status.state.state is JobState.DONE
    assert status.state.started_unix_s is not None  # marked running, the second time
    assert {board.lease(spec.id, c) for c in (0, 1)} == {None}  # every lease dropped


def test_a_running_node_removes_ended_jobs_past_their_retention(tmp_path: Path) -> None:
    """The runner's loop sweeps the job folders at its interval: an ended job past
    ``retention_s`` is removed while the node runs (what stays: test_retention.py)."""
    store = FileStore(tmp_path / "store")
    board = JobBoard(store, "node-a", time.time)
    ended = JobSpec(new_id(time.time()), "echo", "v-1", 1, 1, time.time())
    board.create(ended, [{"x": np.ones((1, 4), np.float32)}])
    board.cancel(ended.id)

    async def scenario() -> None:
        config = JobConfig(poll_interval_s=0.02, retention_s=0.2, sweep_interval_s=0.05)
        runner = JobRunner(board, Pinned(cast(Any, None)), config, lambda: True)  # type: ignore[arg-type]
        runner.start()
        give_up = time.monotonic() + 10
        while store.list(f"jobs/{ended.id}/") and time.monotonic() < give_up:
            await asyncio.sleep(0.02)
        await runner.close()

    asyncio.run(scenario())
    assert store.list(f"jobs/{ended.id}/") == []
