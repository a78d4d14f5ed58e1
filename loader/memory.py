"""The node's memory budgets for loaded instances: what to evict before a load.

Instances (in threads or worker processes) hold memory until they are
unloaded: host memory, and on a GPU device memory too, each with a budget of
its own (``--memory-budget-bytes``, ``--gpu-memory-budget-bytes``). Before a
load, :meth:`MemoryBudget.make_room` unloads the least recently used idle
holders until the load fits; busy ones (running, loading,
or with requests queued) are never evicted, and if they alone fill the
budget the load goes ahead over it. The choice is the pure
:func:`~fnrt.loader.cache.choose_evictions`, shared with the disk cache.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
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
    def device_bytes(self) -> int: ...

    @property
    def last_active_s(self) -> float: ...

    @property
    def busy(self) -> bool: ...

    async def evict(self) -> None: ...


def host_bytes(resident: Resident) -> int:
    return resident.resident_bytes


def device_bytes(resident: Resident) -> int:
    return resident.device_bytes


class MemoryBudget:
    """A bound on the bytes loaded instances hold (None: no bound), in host memory or,
    with ``measure=device_bytes``, in the GPU's."""

    def __init__(
        self,
        budget_bytes: int | None,
        residents: Callable[[], Iterable[Resident]],
        measure: Callable[[Resident], int] = host_bytes,
    ) -> None:
        self.budget_bytes = budget_bytes
        self._residents = residents
        self._measure = measure

    def used_bytes(self) -> int:
        return sum(self._measure(r) for r in self._residents())

    def fits(self, needed_bytes: int) -> bool:
        """Whether ``needed_bytes`` more fit without evicting anything."""
        return self.budget_bytes is None or self.used_bytes() + needed_bytes <= self.budget_bytes

    async def make_room(self, loading: str, needed_bytes: int) -> None:
        """Unload least-recently-used idle residents so ``needed_bytes`` fits the budget."""
        if self.budget_bytes is None:
            return
        measure = self._measure
        others = [r for r in self._residents() if r.key != loading and measure(r)]
        others.sort(key=lambda r: r.last_active_s)
        victims = set(
            choose_evictions(
                self.budget_bytes,
                needed_bytes,
                [(r.key, measure(r)) for r in others],
                {r.key for r in others if r.busy},
            )
        )
        for resident in others:
            if resident.key in victims:
                log.info("evicting %s to make room for %s", resident.key, loading)
                await resident.evict()


#: Called before a load with ("name/version", host bytes, device bytes it expects to need).
MakeRoom = Callable[[str, int, int], Awaitable[None]]


def room_maker(host: MemoryBudget, device: MemoryBudget | None) -> MakeRoom:
    """Make room in host memory, then in the GPU's (when the node runs on one)."""

    async def make_room(loading: str, host_bytes: int, device_bytes: int) -> None:
        await host.make_room(loading, host_bytes)
        if device is not None:
            await device.make_room(loading, device_bytes)

    return make_room
