"""The gateway and its guards alone: no server, a manual clock, real schedulers of small
handlers in threads, and a small fake of the registry (a table of schedulers).

``Gateway.call`` builds a request's one record for the version chosen; ``submit`` runs
the guards and queues it. These check what each guard does, and that a version with
no guard watching outcomes is queued with no coroutine of the gateway's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_pool import Loads

from fnrt.functions.errors import CircuitOpen, HandlerFailed, VersionRetired
from fnrt.functions.handler import Request
from fnrt.functions.manifest import IsolationMode
from fnrt.runtime import scheduler as sched
from fnrt.runtime.batcher import answers_written
from fnrt.runtime.clock import ManualClock
from fnrt.runtime.gateway import Gateway, Target
from fnrt.runtime.queue import Call
from fnrt.runtime.scheduler import Scheduler
from support import packed, write_function

MANIFEST = """
name = "{name}"
handler = "handler:Echo"

[batching]
max_batch_size = 4
max_wait_ms = 0
"""
BREAKER = """
[breaker]
min_requests = 2
open_error_rate = 0.5
open_s = 60
fallback = "cache"
"""
CACHE = """
[result_cache]
enabled = true
"""


class Table:
    """The registry as the gateway sees it: a scheduler per function name."""

    def __init__(self, **schedulers: Scheduler) -> None:
        self.schedulers = schedulers

    def route_now(self, name: str, headers: Any = None) -> Scheduler | None:
        return self.schedulers.get(name)

    async def route(self, name: str, headers: Any = None) -> Scheduler:
        return self.schedulers[name]

    async def get_version(self, name: str, version: str) -> Scheduler:
        return self.schedulers[name]


class Keeper:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def invoked(self, name: str) -> None:
        self.calls.append(name)


def _negate_unless_negative(batch: list[Request]) -> Sequence[Any]:
    if any(float(r["x"][0, 0]) < 0 for r in batch):
        raise ValueError("negative")
    return [{"y": -r["x"]} for r in batch]


def _scheduler(
    tmp_path: Path, clock: ManualClock, loads: Loads, extra: str = "", name: str = "g"
) -> Scheduler:
    vm = packed(write_function(tmp_path, name, manifest=MANIFEST + extra))[0]
    return Scheduler(vm, loads, clock, isolation=IsolationMode.THREAD)


def _x(value: float) -> Request:
    return {"x": np.full((1, 4), value, np.float32)}


async def _ask(gateway: Gateway, scheduler: Scheduler, value: float) -> Any:
    return await gateway.submit(gateway.call(scheduler, _x(value)))


def test_a_default_version_is_queued_with_no_coroutine_and_told_to_the_keeper(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        clock, keeper = ManualClock(), Keeper()
        scheduler = _scheduler(tmp_path, clock, Loads(_negate_unless_negative))
        scheduler.protection.outcomes.watch()  # as a rollout does: kept
        gateway = Gateway(Table(g=scheduler), None, clock, keeper)  # type: ignore[arg-type]
        assert gateway.choose_now(Target("g")) is scheduler
        call = gateway.call(scheduler, _x(2), timeout_s=5.0)
        assert isinstance(call, Call) and call.counted and call.scheduler is scheduler
        assert call.deadline == clock.now() + 5.0
        waiting = gateway.submit(call)
        assert waiting is call.future  # the queue's own future: no frame in between
        served = await waiting
        assert float(served.outputs["y"][0, 0]) == -2.0 and served.cold_tier is not None
        assert keeper.calls == ["g"]
        # the breaker counted it, per batch, where it was answered
        assert scheduler.protection.outcomes.summary(0.0).requests == 1
        await sched.close(scheduler)

    asyncio.run(scenario())


def test_the_result_cache_answers_repeated_inputs_without_computing(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock, loads = ManualClock(), Loads(_negate_unless_negative)
        scheduler = _scheduler(tmp_path, clock, loads, CACHE)
        gateway = Gateway(Table(g=scheduler), None, clock)  # type: ignore[arg-type]
        first = await _ask(gateway, scheduler, 3)
        second = await _ask(gateway, scheduler, 3)
        assert not first.cached and second.cached
        assert np.array_equal(first.outputs["y"], second.outputs["y"])
        await answers_written()  # a lone batch is accounted after its answer
        assert scheduler.stats.batches == 1  # computed once
        assert scheduler.stats.totals.cache_hit.count == 1
        await sched.close(scheduler)

    asyncio.run(scenario())


def test_an_open_breaker_answers_known_inputs_from_the_last_results(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = ManualClock()
        scheduler = _scheduler(tmp_path, clock, Loads(_negate_unless_negative), BREAKER)
        gateway = Gateway(Table(g=scheduler), None, clock)  # type: ignore[arg-type]
        known = await _ask(gateway, scheduler, 1)
        for _ in range(2):  # two of three failed: past the error rate
            with pytest.raises(HandlerFailed):
                await _ask(gateway, scheduler, -1)
        assert scheduler.protection.breaker.state.value == "open"
        again = await _ask(gateway, scheduler, 1)
        assert again.fallback == "cache" and np.array_equal(again.outputs["y"], known.outputs["y"])
        with pytest.raises(CircuitOpen):
            await _ask(gateway, scheduler, 5)  # never computed: no last result
        assert scheduler.stats.batches == 3
        await sched.close(scheduler)

    asyncio.run(scenario())


def test_a_retired_version_names_its_successor_unless_pinned(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = ManualClock()
        old = _scheduler(tmp_path / "old", clock, Loads(), name="g")
        new = _scheduler(tmp_path / "new", clock, Loads(), name="g")
        table = Table(g=old)
        gateway = Gateway(table, None, clock)  # type: ignore[arg-type]
        await sched.close(old)  # retired: admission refuses
        with pytest.raises(VersionRetired):
            gateway.submit(gateway.call(old, _x(1)))
        with pytest.raises(VersionRetired):  # the routing still names it: no other
            await gateway.successor(Target("g"), old)
        table.schedulers["g"] = new
        assert await gateway.successor(Target("g"), old) is new
        with pytest.raises(VersionRetired):  # a pinned version has no successor
            await gateway.successor(Target("g", version="v-1"), old)
        served = await _ask(gateway, new, 4)
        assert float(served.outputs["y"][0, 0]) == 8.0  # Loads' default handler doubles
        await sched.close(new)

    asyncio.run(scenario())
