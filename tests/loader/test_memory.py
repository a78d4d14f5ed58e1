"""The memory budget: least recently used idle residents go first; busy ones never."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fnrt.loader.memory import MemoryBudget


@dataclass
class Held:
    key: str
    resident_bytes: int
    last_active_s: float
    busy: bool = False
    evicted: bool = False

    async def evict(self) -> None:
        self.evicted = True
        self.resident_bytes = 0


def test_make_room_evicts_oldest_idle_first_and_never_busy_ones() -> None:
    held = [Held("a", 400, 1.0), Held("b", 400, 0.5, busy=True), Held("c", 400, 2.0)]
    budget = MemoryBudget(1000, lambda: held)
    assert not budget.fits(300) and budget.fits(-200)
    asyncio.run(budget.make_room("new", 100))
    assert [h.evicted for h in held] == [True, False, False]  # a was enough
    asyncio.run(budget.make_room("new", 900))
    assert [h.evicted for h in held] == [True, False, True]  # b is busy: over budget
    assert budget.used_bytes() == 400


def test_the_loading_resident_and_an_unbounded_budget_are_left_alone() -> None:
    held = [Held("a", 900, 1.0)]
    asyncio.run(MemoryBudget(1000, lambda: held).make_room("a", 500))
    asyncio.run(MemoryBudget(None, lambda: held).make_room("b", 10**12))
    assert not held[0].evicted
