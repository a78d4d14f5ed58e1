"""The node's memory budget for loaded instances: what to evict before a load.

Instances (in threads or worker processes) hold memory until they are
unloaded. Before a load, :meth:`MemoryBudget.make_room` unloads the least
recently used idle holders until the load fits; busy ones (running, loading,
or with requests queued) are never evicted, and if they alone fill the
budget the load goes ahead over it. The choice is the pure
:func:`~fnrt.loader.cache.choose_evictions`, shared with the disk cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from fnrt.loader.cache import choose_evictions

log = logging.getLogger("fnrt.memory")


class Resident(Protocol):
    """Something holding loaded instances (a function version's scheduler)."""

    @property
    def key(self) -> str: ...

    @property
    def resident_bytes(self) -> int: ...

    @property
    def last_active_s(self) -> float: ...

    @property
    def busy(self) -> bool: ...

    async def evict(self) -> None: ...


class MemoryBudget:
    """A bound on the bytes loaded instances hold (None: no bound)."""

    def __init__(
        self, budget_bytes: int | None, residents: Callable[[], Iterable[Resident]]
    ) -> None:
        self.budget_bytes = budget_bytes
        self._residents = residents

    def used_bytes(self) -> int:
        return sum(r.resident_bytes for r in self._residents())

    def fits(self, needed_bytes: int) -> bool:
        """Whether ``needed_bytes`` more fit without evicting anything."""
        return self.budget_bytes is None or self.used_bytes() + needed_bytes <= self.budget_bytes

    async def make_room(self, loading: str, needed_bytes: int) -> None:
        """Unload least-recently-used idle residents so ``needed_bytes`` fits the budget."""
        if self.budget_bytes is None:
            return
        others = [r for r in self._residents() if r.key != loading and r.resident_bytes]
        others.sort(key=lambda r: r.last_active_s)
        victims = set(
            choose_evictions(
                self.budget_bytes,
                needed_bytes,
                [(r.key, r.resident_bytes) for r in others],
                {r.key for r in others if r.busy},
            )
        )
        for resident in others:
            if resident.key in victims:
                log.info("evicting %s to make room for %s", resident.key, loading)
                await resident.evict()
