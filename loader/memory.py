"""The node's memory budgets for loaded instances: what to evict before a load.

Instances (in threads or worker processes) hold memory until they are
unloaded: host memory, and on a GPU device memory too, each with a budget of
its own (``--memory-budget-bytes``, ``--gpu-memory-budget-bytes``). The node's
memory is a cache of warm functions: before a load,
:meth:`MemoryBudget.make_room` unloads the idle holders worth least until the
load fits, each one's worth the expected price of the cold start it saves per
GB·minute it will yet be held (its keep-alive plan's, from the keeper:
:class:`~fnrt.runtime.prewarm.policies.Worth`), not how recently it was used;
those with no plan go first, least recently used first. Busy ones (running,
loading, or with requests queued) are never evicted, and if they alone fill the
budget the load goes ahead over it; a pre-warm evicts only instances worth less
than it will be, never one pre-warmed for a call that is due. The choice is the
pure :func:`evictions` (over :func:`~fnrt.loader.cache.choose_evictions`, shared
with the disk cache), which ``fnrt simulate --node-memory-gb`` runs too. The room
a load made is its own until it is loaded (or fails): :meth:`MemoryBudget.make_room`
reserves it, and the loads that come meanwhile count it, as the simulator counts a
load's bytes at once. (A load asks for its room once its files are on this disk:
its download is not part of it. An instance in a worker process holds its worker's
own memory too, ``launch.worker_bytes``.)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from itertools import count
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

    async def evict(self) -> bool:
        """Unload its idle instances now; whether any was unloaded (one that turned busy
        meanwhile is kept)."""
        ...


@dataclass(frozen=True)
class Held:
    """One holder of memory as an eviction sees it."""

    key: str
    size: int  # bytes
    worth: float  # what keeping it is worth (see the module docstring): least goes first
    last_active_s: float  # among equals, the least recently used goes first
    pinned: bool = False  # busy, or loaded ahead for a call that is due: never evicted


def evictions(budget: int, needed: int, held: Iterable[Held]) -> list[str]:
    """Which to evict, in order, so ``needed`` more fits ``budget`` (as much as can be
    freed when the pinned ones alone fill it): the server's budget and the simulator's
    node both decide here."""
    order = sorted(held, key=lambda h: (h.worth, h.last_active_s, h.key))
    pinned = {h.key for h in order if h.pinned}
    return choose_evictions(budget, needed, [(h.key, h.size) for h in order], pinned)


#: What a resident is worth keeping, and whether it was pre-warmed for a call now due.
Appraise = Callable[["Resident"], tuple[float, bool]]
#: Told of each eviction: the victim's key and why ("budget").
Evicted = Callable[[str, str], None]


class Holders:
    """The residents holding (or loading) an instance now, each added and removed as its
    pool starts and stops (:meth:`holding`): what the budgets weigh (called, the list
    of them; one loading holds no bytes yet), in time that follows the instances
    loaded, not every version a node has served (a look at each of 10,000 took 18 ms a
    check, 30 ms a load's room)."""

    def __init__(self) -> None:
        self._held: dict[int, Resident] = {}  # by identity, in the order they came

    def holding(self, resident: Resident, holds: bool) -> None:
        if holds:
            self._held[id(resident)] = resident
        else:
            self._held.pop(id(resident), None)

    def __call__(self) -> list[Resident]:
        return list(self._held.values())  # (one step under the GIL: safe from a thread)


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
        appraise: Appraise | None = None,
        evicted: Evicted | None = None,
    ) -> None:
        self.budget_bytes = budget_bytes
        self._residents = residents
        self._measure = measure
        self.appraise = appraise  # None: all worth the same (least recently used first)
        self.evicted = evicted
        self._reserved: dict[int, tuple[str, int]] = {}  # loads under way: key, bytes
        self._tokens = count()

    @property
    def reserved_bytes(self) -> int:
        """The room loads under way made for themselves and hold until they are loaded."""
        return sum(size for _, size in self._reserved.values())

    def holding_room(self) -> set[str]:
        """The keys of the loads under way that hold room here."""
        return {key for key, _ in self._reserved.values()}

    def used_bytes(self) -> int:
        return sum(self._measure(r) for r in self._residents()) + self.reserved_bytes

    def fits(self, needed_bytes: int) -> bool:
        """Whether ``needed_bytes`` more fit without evicting anything."""
        return self.budget_bytes is None or self.used_bytes() + needed_bytes <= self.budget_bytes

    def held(self, loading: str, below: float | None = None) -> list[Held]:
        """Every other resident holding memory, as :func:`evictions` weighs them; with
        ``below`` (a pre-warm's worth), those worth as much and those pre-warmed for a
        call that is due are kept too (a pre-warm never takes another's place)."""
        return [held for held, _ in self._weighed(loading, below)]

    def _weighed(self, loading: str, below: float | None) -> list[tuple[Held, Resident]]:
        measure, appraise = self._measure, self.appraise
        out = []
        for r in self._residents():
            size = measure(r)
            if not size:
                continue
            if r.key == loading:  # its own instances (scaling out): counted, never evicted
                out.append((Held(r.key, size, 0.0, r.last_active_s, True), r))
                continue
            worth, due = appraise(r) if appraise is not None else (0.0, False)
            keep = below is not None and (due or worth >= below)
            out.append((Held(r.key, size, worth, r.last_active_s, r.busy or keep), r))
        return out

    def _reserve(self, loading: str, needed_bytes: int) -> Callable[[], None]:
        """Hold ``needed_bytes`` for a load until the returned call (once it is loaded,
        and counted as a resident, or failed)."""
        if needed_bytes <= 0:
            return no_room
        token = next(self._tokens)
        self._reserved[token] = (loading, needed_bytes)

        def release() -> None:
            self._reserved.pop(token, None)

        return release

    async def make_room(
        self, loading: str, needed_bytes: int, below: float | None = None
    ) -> Callable[[], None]:
        """Unload the idle residents worth least so ``needed_bytes`` fits the budget
        (``below``: only those worth less than that, e.g. for a pre-warm), and hold that
        room for the load, which the loads that come meanwhile count: the returned call
        gives it back (once the instance holds it, or the load failed)."""
        if self.budget_bytes is None:
            return no_room
        if needed_bytes > self.budget_bytes:
            log.warning(
                "%s needs %d bytes, more than the whole memory budget (%d): loaded over it",
                loading,
                needed_bytes,
                self.budget_bytes,
            )
        weighed: list[tuple[Held, Resident | None]] = list(self._weighed(loading, below))
        weighed += [  # the room other loads under way hold: never evicted
            (Held(key, size, 0.0, 0.0, True), None) for key, size in self._reserved.values()
        ]
        # each its own name for the choice: two may share a key (a version's scheduler
        # still closing beside its replacement); a NUL sorts them as their keys sort
        named = {f"{h.key}\0{i}": (h, r) for i, (h, r) in enumerate(weighed)}
        held = [replace(h, key=name) for name, (h, _) in named.items()]
        victims = evictions(self.budget_bytes, needed_bytes, held)
        freed = sum(named[name][0].size for name in victims)
        if below is not None and sum(h.size for h in held) - freed + needed_bytes > (
            self.budget_bytes
        ):
            return no_room  # a pre-warm that would not fit anyway takes nobody's place
        release = self._reserve(loading, needed_bytes)  # before the evictions' waits
        try:
            for name in victims:
                resident = named[name][1]
                assert resident is not None  # (reservations are pinned)
                if not await resident.evict():  # turned busy meanwhile: kept, not counted
                    log.info("kept %s, busy again, for %s", resident.key, loading)
                    continue
                log.info("evicting %s to make room for %s (reason: budget)", resident.key, loading)
                if self.evicted is not None:
                    self.evicted(resident.key, "budget")
        except BaseException:  # cancelled, or an unload failed: the load will not come
            release()
            raise
        return release


def no_room() -> None:
    """What gives back no room: none was held (no budget, or none needed)."""


#: Called before a load with ("name/version", host bytes, device bytes it expects to
#: need): makes the room and holds it; what it returns gives it back once the instance
#: is loaded (and counted where it is held) or the load failed.
MakeRoom = Callable[[str, int, int], Awaitable[Callable[[], None]]]


def room_maker(host: MemoryBudget, device: MemoryBudget | None) -> MakeRoom:
    """Make room in host memory, then in the GPU's (when the node runs on one)."""

    async def make_room(loading: str, host_bytes: int, device_bytes: int) -> Callable[[], None]:
        release_host = await host.make_room(loading, host_bytes)
        if device is None:
            return release_host
        try:
            release_device = await device.make_room(loading, device_bytes)
        except BaseException:
            release_host()
            raise

        def release() -> None:
            release_host()
            release_device()

        return release

    return make_room
