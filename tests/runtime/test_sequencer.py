"""The continuous batcher alone: no server, a manual clock, the real pool and a real
generative instance in a thread (the counter handler, stepped by ``loader/stepper.py``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fnrt.functions.errors import (
    DeadlineExceeded,
    HandlerFailed,
    InstanceStopped,
    LoadError,
    Overloaded,
)
from fnrt.functions.generation import Chunk, Generator, parse_parameters
from fnrt.functions.version import VersionManifest
from fnrt.loader.instance import Instance
from fnrt.loader.stepper import Stepper
from fnrt.runtime.clock import ManualClock
from fnrt.runtime.events import NoEvents
from fnrt.runtime.intake import Admission
from fnrt.runtime.pool import InstancePool
from fnrt.runtime.protection import Protection
from fnrt.runtime.sequencer import Sequencer
from fnrt.runtime.stats import Stats
from support import (
    COUNTER_HANDLER,
    COUNTER_MANIFEST,
    instances_up,
    packed,
    past_backoffs,
    write_function,
)


class Counter(Generator):
    """Counts up from its input, one token a step, to ``until``."""

    def start(self, sequences: Any) -> Any:
        for s in sequences:
            s.state = int(s.inputs["x"][0])
        return [self.emit(s) for s in sequences]

    def step(self, sequences: Any) -> Any:
        self.sizes.append(len(sequences))
        return [self.emit(s) for s in sequences]

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def emit(self, s: Any) -> Chunk:
        s.state += 1
        until = s.parameters.get("until")
        return Chunk({"n": [s.state], "text": [b"."]}, done=until is not None and s.state >= until)


class Slow(Counter):
    """A counter whose every step takes 10 ms (in its instance's thread), and whose step
    raises once a sequence asked to ``fail_at`` a number reaches it."""

    def step(self, sequences: Any) -> Any:
        time.sleep(0.01)
        for s in sequences:
            if s.parameters.get("fail_at") == s.state + 1:
                raise ValueError(f"failed at {s.state + 1}")
        return super().step(sequences)


class Loads:
    """Real instances of ``handler`` (a ``Counter``) in a thread; the first load waits
    for ``gate``."""

    def __init__(self, gate: threading.Event | None = None, handler: Counter | None = None) -> None:
        self.gate, self.handler = gate, handler or Counter()

    def __call__(self, vm: VersionManifest, executor: ThreadPoolExecutor) -> Instance:
        if self.gate is not None:
            self.gate.wait(10)
        stepper = Stepper(self.handler, vm)
        return Instance(vm, lambda batch: [], executor, None, {"total_s": 0.0}, 1, stepper=stepper)


class Parts:
    def __init__(
        self, tmp_path: Path, loads: Loads, max_active: int = 2, manifest: str = COUNTER_MANIFEST
    ) -> None:
        folder = write_function(
            tmp_path, "seq", COUNTER_HANDLER, manifest,
            max_active=max_active, max_queue=3, mode="thread",
        )  # fmt: skip
        self.vm = packed(folder)[0]
        self.clock, self.stats = ManualClock(), Stats()
        self.pool = InstancePool(self.vm, loads, self.clock, self.stats, NoEvents(), in_thread=True)
        self.protection = Protection(self.vm.manifest, self.clock)
        self.sequencer = Sequencer(
            self.vm, self.pool, self.clock, self.stats, NoEvents(), Admission(100), self.protection
        )

    def submit(
        self, start: int, until: int, timeout_s: float | None = None, **parameters: int
    ) -> Any:
        config = self.vm.manifest.generation
        assert config is not None
        asked = parse_parameters(config, {"until": until, **parameters})
        x = {"x": np.array([start], np.int64)}
        call = self.sequencer.call(
            x, self.clock.now(), timeout_s=timeout_s, asked=asked, counted=True
        )
        return self.sequencer.submit(call)


async def _tokens(served: Any) -> list[int]:
    return [int(chunk["n"][0]) async for chunk in served.stream]


def test_sequences_join_and_leave_a_running_batch(tmp_path: Path) -> None:
    async def scenario() -> None:
        loads = Loads()
        parts = Parts(tmp_path, loads, max_active=2)
        parts.protection.outcomes.watch()  # as a rollout does: kept
        answers = [await parts.submit(0, 6), await parts.submit(10, 12), await parts.submit(20, 21)]
        assert all(a.stream is not None for a in answers)  # answered at once: its stream
        got = await asyncio.gather(*(_tokens(a) for a in answers))
        assert got == [[1, 2, 3, 4, 5, 6], [11, 12], [21]]
        assert max(loads.handler.sizes) == 2  # never more than max_active in a step
        assert [a.stream.ended.reason for a in answers] == ["stop", "stop", "stop"]
        assert parts.sequencer.outstanding == 0
        assert parts.protection.outcomes.summary(0.0).requests == 3  # counted as they end
        await parts.sequencer.close()

    asyncio.run(scenario())


def test_a_queued_sequence_past_its_deadline_fails_through_its_stream(tmp_path: Path) -> None:
    async def scenario() -> None:
        gate = threading.Event()  # the first load waits: nothing runs
        parts = Parts(tmp_path, Loads(gate))
        late = await parts.submit(0, 3, timeout_s=1.0)
        patient = await parts.submit(5, 6)
        parts.clock.advance(2.0)  # the queue's one deadline timer fires
        await asyncio.sleep(0.01)
        with pytest.raises(DeadlineExceeded, match="in the queue"):
            await late.stream.next()
        assert parts.stats.expired == 1
        parts.submit(1, 2)
        with pytest.raises(Overloaded):  # max_queue = 3: the expired one is still queued
            parts.submit(1, 2)
        gate.set()
        assert await _tokens(patient) == [6]
        await parts.sequencer.close()

    asyncio.run(scenario())


async def _first(served: Any, count: int) -> list[int]:
    """The first ``count`` tokens of a stream, read as they come."""
    return [int((await served.stream.next())["n"][0]) for _ in range(count)]


def test_a_sequence_whose_reader_left_ends_and_one_waiting_takes_its_place(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        loads = Loads(handler=Slow())
        parts = Parts(tmp_path, loads, max_active=1)
        parts.protection.outcomes.watch()  # as a rollout does: kept
        left = await parts.submit(0, 1000)  # would run to max_new_tokens (50)
        waiting = await parts.submit(10, 13)  # max_active 1: it waits its turn
        assert await _first(left, 3) == [1, 2, 3]
        left.stream.cancel()  # its reader went away
        assert await _tokens(waiting) == [11, 12, 13]
        assert left.stream.ended.reason == "cancelled"
        assert left.stream.ended.usage.completion_tokens < 50
        assert waiting.stream.ended.reason == "stop"
        assert max(loads.handler.sizes) == 1 and parts.sequencer.outstanding == 0
        assert parts.sequencer.generation.ended == {"cancelled": 1, "stop": 1}
        # a client that left says nothing of the version: not a success, for a canary
        assert parts.protection.outcomes.summary(0.0).requests == 1
        await parts.sequencer.close()

    asyncio.run(scenario())


def test_a_sequence_past_its_deadline_mid_generation_ends_with_what_it_made(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        parts = Parts(tmp_path, Loads(handler=Slow()), max_active=2)
        parts.protection.outcomes.watch()  # as a rollout does: kept
        late = await parts.submit(0, 1000, timeout_s=1.0)
        other = await parts.submit(100, 1000)
        assert await _first(late, 2) == [1, 2]
        parts.clock.advance(2.0)  # its deadline passes between two steps
        rest = await _tokens(late)
        assert late.stream.ended.reason == "deadline"
        assert rest == list(range(3, 3 + len(rest))) and len(rest) < 48
        assert other.stream.ended is None and not other.stream.done  # still running
        other.stream.cancel()
        await _tokens(other)
        assert other.stream.ended.reason == "cancelled"
        # its deadline passed: a failure of the version's (as a batch request's), for the
        # breaker and a canary; the one whose client left, neither
        outcomes = parts.protection.outcomes.summary(0.0)
        assert (outcomes.requests, outcomes.errors) == (1, 1)
        await parts.sequencer.close()

    asyncio.run(scenario())


def test_a_failed_step_fails_its_sequences_and_the_next_are_served(tmp_path: Path) -> None:
    async def scenario() -> None:
        parts = Parts(tmp_path, Loads(handler=Slow()), max_active=2)
        failing = await parts.submit(0, 10, fail_at=3)
        beside = await parts.submit(20, 40)  # in the same steps: the step fails whole
        with pytest.raises(HandlerFailed):
            await _tokens(failing)
        with pytest.raises(HandlerFailed):
            await _tokens(beside)
        assert parts.sequencer.outstanding == 0
        after = await parts.submit(50, 52)
        assert await _tokens(after) == [51, 52]
        assert after.stream.ended.reason == "stop"
        await parts.sequencer.close()

    asyncio.run(scenario())


class Failing(Loads):
    """Loads that succeed until ``failing`` is set, then fail (the store went down)."""

    failing = False

    def __call__(self, vm: VersionManifest, executor: ThreadPoolExecutor) -> Instance:
        if self.failing:
            raise OSError("weights are corrupt")
        return super().__call__(vm, executor)


TWO = COUNTER_MANIFEST.replace(
    "max_queue = {max_queue}", "max_queue = {max_queue}\nmin_instances = 2\nmax_instances = 2"
)


def test_closing_while_the_primary_cannot_load_ends_once_the_others_drain(
    tmp_path: Path,
) -> None:
    """The primary slot lost its instance and its loads fail now, while a second slot
    generates. Closing the version ends once the queued sequences are done: the
    primary does not wait for an arrival that cannot come."""

    loads = Failing(handler=Slow())

    async def scenario() -> None:
        parts = Parts(tmp_path, loads, max_active=1, manifest=TWO)
        pool, clock = parts.pool, parts.clock
        assert await _tokens(await parts.submit(0, 2)) == [1, 2]
        await instances_up(pool, 2)
        await pool.drop(pool.slots[0])  # the primary's instance is gone
        loads.failing = True
        served = [asyncio.ensure_future(parts.submit(10 * i, 10 * i + 5)) for i in range(3)]
        await asyncio.sleep(0.02)
        closed = asyncio.ensure_future(parts.sequencer.close())
        # the primary's load backs off, then fails again
        assert await past_backoffs(closed, clock), "the version never finished closing"
        answers = await asyncio.gather(*served)
        tokens = await asyncio.gather(*(_tokens(a) for a in answers))
        assert tokens == [list(range(10 * i + 1, 10 * i + 6)) for i in range(3)]

    asyncio.run(scenario())


def test_sequences_on_an_instance_lost_while_others_serve_end_with_its_error(
    tmp_path: Path,
) -> None:
    """The primary's instance is gone mid-generation and its load fails, while a second
    instance serves: the sequences that ran on it end at once, with the load's error (or
    503 for a step queued on it just before), not stalled until some other call arrives."""
    loads = Failing(handler=Slow())

    async def scenario() -> None:
        parts = Parts(tmp_path, loads, max_active=1, manifest=TWO)
        pool = parts.pool
        assert await _tokens(await parts.submit(0, 2)) == [1, 2]
        await instances_up(pool, 2)
        first, second = await parts.submit(0, 30), await parts.submit(100, 130)
        await asyncio.sleep(0.05)  # each instance steps one (max_active = 1)
        loads.failing = True
        await pool.drop(pool.slots[0])
        ended = await asyncio.wait_for(
            asyncio.gather(_tokens(first), _tokens(second), return_exceptions=True), 5
        )
        # a step the sequencer queued on it just before the drop is stopped (503, retry);
        # else its sequence waits for the reload, which fails
        lost = [e for e in ended if isinstance(e, LoadError | InstanceStopped)]
        assert len(lost) == 1, ended
        assert "weights are corrupt" in str(lost[0]) or "unloaded before it ran" in str(lost[0])
        assert [list(range(1, 31)), list(range(101, 131))].count(
            next(e for e in ended if not isinstance(e, BaseException))
        ) == 1
        await asyncio.wait_for(parts.sequencer.close(), 5)

    asyncio.run(scenario())
