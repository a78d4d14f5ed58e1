"""The job runner alone: no server. Its real neighbours: a job board on a folder store
and a real scheduler of a small handler in a thread; the registry is a small fake (the
one version the job pinned)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, cast

import numpy as np

from fnrt.functions.errors import NotFound
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

    async def get_version(self, function: str, version: str) -> Scheduler:
        if (function, version) != (self.scheduler.name, self.scheduler.version.version):
            raise NotFound(f"function '{function}' has no version {version}")
        return self.scheduler


def _triple_unless_negative(batch: list[Request]) -> Sequence[Any]:
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
