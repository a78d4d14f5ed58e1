"""The continuous batcher alone: no server, a manual clock, the real pool and a real
generative instance in a thread (the counter handler, stepped by ``loader/stepper.py``).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fnrt.functions.errors import DeadlineExceeded, Overloaded
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
from support import COUNTER_HANDLER, COUNTER_MANIFEST, packed, write_function


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


class Loads:
    """Real instances of ``Counter`` in a thread; the first load waits for ``gate``."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate, self.handler = gate, Counter()

    def __call__(self, vm: VersionManifest, executor: ThreadPoolExecutor) -> Instance:
        if self.gate is not None:
            self.gate.wait(10)
        stepper = Stepper(self.handler, vm)
        return Instance(vm, lambda batch: [], executor, None, {"total_s": 0.0}, 1, stepper=stepper)


class Parts:
    def __init__(self, tmp_path: Path, loads: Loads, max_active: int = 2) -> None:
        folder = write_function(
            tmp_path, "seq", COUNTER_HANDLER, COUNTER_MANIFEST,
            max_active=max_active, max_queue=3, mode="thread",
        )  # fmt: skip
        self.vm = packed(folder)[0]
        self.clock, self.stats = ManualClock(), Stats()
        self.pool = InstancePool(self.vm, loads, self.clock, self.stats, NoEvents(), in_thread=True)
        self.protection = Protection(self.vm.manifest, self.clock)
        self.sequencer = Sequencer(
            self.vm, self.pool, self.clock, self.stats, NoEvents(), Admission(100), self.protection
        )

    def submit(self, start: int, until: int, timeout_s: float | None = None) -> Any:
        config = self.vm.manifest.generation
        assert config is not None
        asked = parse_parameters(config, {"until": until})
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
