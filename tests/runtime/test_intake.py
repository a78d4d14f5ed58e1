"""What the batch and generative queues share (``intake.py``), through a batcher alone:
no server, a manual clock, the real pool with small handlers in threads.

Deadlines are watched by one timer per queue (armed at the earliest deadline), never
one per request; outcomes are settled per batch, and only the calls the gateway let
through (``counted``) count for the breaker.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_pool import Loads

from fnrt.functions.errors import DeadlineExceeded, HandlerFailed, LoadError
from fnrt.functions.handler import Request
from fnrt.runtime.batcher import Batcher
from fnrt.runtime.clock import ManualClock
from fnrt.runtime.events import NoEvents
from fnrt.runtime.intake import Admission
from fnrt.runtime.pool import InstancePool
from fnrt.runtime.protection import Protection
from fnrt.runtime.stats import Stats
from support import packed, write_function

MANIFEST = """
name = "{name}"
handler = "handler:Echo"

[batching]
max_batch_size = 4
max_wait_ms = 0

[breaker]
min_requests = 2
open_error_rate = 0.5
"""


class Parts:
    """A batcher with its real neighbours, built here so the test holds each."""

    def __init__(self, tmp_path: Path, loads: Loads, admission: Admission | None = None) -> None:
        vm = packed(write_function(tmp_path, "i", manifest=MANIFEST))[0]
        self.clock, self.stats = ManualClock(), Stats()
        self.pool = InstancePool(vm, loads, self.clock, self.stats, NoEvents(), in_thread=True)
        self.protection = Protection(vm.manifest, self.clock)
        self.admission = admission or Admission(100)
        self.batcher = Batcher(
            vm, self.pool, self.clock, self.stats, NoEvents(), self.admission, self.protection
        )

    def submit(self, value: float, *, timeout_s: float | None = None, counted: bool = True) -> Any:
        x = {"x": np.full((1, 4), value, np.float32)}
        call = self.batcher.call(x, self.clock.now(), timeout_s=timeout_s, counted=counted)
        return self.batcher.submit(call)


def _gated(gate: threading.Event) -> Loads:
    def run(batch: list[Request]) -> Sequence[Any]:
        gate.wait(10)
        if any(float(r["x"][0, 0]) < 0 for r in batch):
            raise ValueError("negative")
        return [{"y": r["x"]} for r in batch]

    return Loads(run)


def test_deadlines_are_watched_by_one_timer_per_queue(tmp_path: Path) -> None:
    async def scenario() -> None:
        gate = threading.Event()
        parts = Parts(tmp_path, _gated(gate))
        parts.protection.outcomes.watch()  # as a rollout does: kept
        running = parts.submit(0)  # takes the instance: the rest wait in the queue
        while parts.batcher.queued:
            await asyncio.sleep(0.01)
        late = [parts.submit(i, timeout_s=t) for i, t in ((1, 3.0), (2, 1.0), (3, 2.0))]
        patient = parts.submit(4)
        await asyncio.sleep(0)
        timers = [t for t in asyncio.all_tasks() if "_expire_due" in repr(t)]
        assert len(timers) == 1  # one for the queue, at the earliest deadline
        parts.clock.advance(1.5)
        await asyncio.sleep(0.01)
        assert [f.done() for f in late] == [False, True, False]
        parts.clock.advance(2.0)
        await asyncio.sleep(0.01)
        assert all(f.done() for f in late) and not patient.done()
        for future in late:
            with pytest.raises(DeadlineExceeded, match="in the queue"):
                future.result()
        assert parts.stats.expired == 3
        gate.set()
        await running
        assert float((await patient).outputs["y"][0, 0]) == 4.0
        assert parts.admission.queued == 0
        # the expired count for the breaker too (a server-side failure), per call
        assert parts.protection.outcomes.summary(0.0).errors == 3
        await parts.batcher.close()

    asyncio.run(scenario())


def test_only_counted_calls_reach_the_breaker(tmp_path: Path) -> None:
    async def scenario() -> None:
        gate = threading.Event()
        gate.set()
        parts = Parts(tmp_path, _gated(gate))
        parts.protection.outcomes.watch()  # as a rollout does: kept
        for counted in (False, False, True):
            with pytest.raises(HandlerFailed):
                await parts.submit(-1, counted=counted)
        await parts.submit(1, counted=False)
        summary = parts.protection.outcomes.summary(0.0)
        assert (summary.requests, summary.errors) == (1, 1)
        assert parts.stats.totals.fail.count == 3 and parts.stats.totals.success.count == 1
        await parts.batcher.close()

    asyncio.run(scenario())


def test_a_load_that_fails_with_nobody_serving_answers_everything_queued(tmp_path: Path) -> None:
    async def scenario() -> None:
        parts = Parts(tmp_path, Loads(fail=1), Admission(10))
        waiting = [parts.submit(i) for i in range(3)]
        done = await asyncio.gather(*waiting, return_exceptions=True)
        assert all(isinstance(d, LoadError) for d in done)
        assert parts.admission.queued == 0 and parts.batcher.queued == 0
        assert parts.stats.errors == 3
        await parts.batcher.close()

    asyncio.run(scenario())
