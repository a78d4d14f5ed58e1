"""What a lone request waits for in the batcher: nothing that is not its own.

(``test_batcher.py`` tests the batcher's policy; these, the order of its work
around one request's answer.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from test_pool import Loads

from fnrt.runtime.batcher import Batcher
from fnrt.runtime.clock import ManualClock
from fnrt.runtime.events import NoEvents
from fnrt.runtime.pool import InstancePool
from fnrt.runtime.stats import Stats
from support import packed, write_function

MANIFEST = """
name = "{name}"
handler = "handler:Echo"

[batching]
max_batch_size = 4
max_wait_ms = 0
"""


def test_a_lone_requests_answer_leaves_before_its_batchs_accounting(tmp_path: Path) -> None:
    """The caller of a lone request resumes with its answer (and its route writes it)
    before the batch's statistics, cost model, metrics and spans are made: they come
    a turn of the loop later, off the request's path."""
    vm = packed(write_function(tmp_path, "b", manifest=MANIFEST))[0]
    clock, stats = ManualClock(), Stats()
    batched: list[int] = []

    async def scenario() -> None:
        batcher = Batcher(
            vm, InstancePool(vm, Loads(), clock, stats, NoEvents()), clock, stats, NoEvents()
        )
        x = {"x": np.ones((1, 4), np.float32)}
        for i in range(3):  # the first loads its instance
            await batcher.submit(batcher.call(x, 1000.0))
            batched.append(stats.batches)  # what was counted when the caller resumed
            for _ in range(4):
                await asyncio.sleep(0)
            assert stats.batches == i + 1  # counted, a turn later
        await batcher.close()

    asyncio.run(scenario())
    assert batched == [0, 1, 2]
