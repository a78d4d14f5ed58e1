"""Which GPU a new instance goes to: the one with the most free budget.

A node on ``--device cuda`` uses every visible GPU (or those ``cuda:1,cuda:3``
lists). Each GPU has its own budget (``--gpu-memory-budget-bytes``, else 90% of
its memory) and its own cap on instances (``--gpu-concurrency``). A load asks
:meth:`Placement.choose` for a device: the pure :func:`place` picks the GPU
with the most budget left among those under their cap, counting what loaded
instances hold there (their tensors and their workers' CUDA contexts, measured)
and what loads already placed there are about to take.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fnrt.functions.handler import Device
from fnrt.loader.memory import MemoryBudget, Resident, device_bytes


@dataclass(frozen=True)
class DeviceRoom:
    """One GPU as placement sees it."""

    device: Device
    budget_bytes: int
    used_bytes: int  # what its instances hold, and loads on their way there
    instances: int

    @property
    def free_bytes(self) -> int:
        return self.budget_bytes - self.used_bytes


def place(rooms: Sequence[DeviceRoom], cap: int = 0) -> Device | None:
    """The device with the most free budget among those with fewer than ``cap``
    instances (0: no cap); ties go to fewer instances, then the lower number. None
    when every device is at its cap."""
    open_rooms = [r for r in rooms if not cap or r.instances < cap]
    if not open_rooms:
        return None
    best = max(open_rooms, key=lambda r: (r.free_bytes, -r.instances, -r.device.index))
    return best.device


#: (device, device bytes) of each loaded instance.
Holders = Callable[[], Iterable[tuple[Device, int]]]


class Placement:
    """The node's GPUs, their budgets and caps, and the loads placed on them."""

    def __init__(
        self,
        devices: Sequence[Device],
        budget_bytes: dict[int, int],
        holders: Holders,
        cap: int = 0,
    ) -> None:
        if not devices or any(d.kind != "cuda" for d in devices):
            raise ValueError("devices: placement is for one GPU or more")
        self.devices = list(devices)
        self.budget_bytes = dict(budget_bytes)
        self.cap = cap
        self._holders = holders
        self._placing: dict[int, list[int]] = {d.index: [] for d in devices}
        self._lock = threading.Lock()  # loads run on their instances' threads

    def rooms(self) -> list[DeviceRoom]:
        used = {d.index: sum(self._placing[d.index]) for d in self.devices}
        count = {d.index: len(self._placing[d.index]) for d in self.devices}
        for device, nbytes in self._holders():
            if device.index in used:
                used[device.index] += nbytes
                count[device.index] += 1
        return [
            DeviceRoom(d, self.budget_bytes[d.index], used[d.index], count[d.index])
            for d in self.devices
        ]

    def has_room(self) -> bool:
        """Whether one more instance may go on some GPU (under its cap)."""
        with self._lock:
            return place(self.rooms(), self.cap) is not None

    def peek(self) -> Device:
        """The device :meth:`choose` would give now (nothing is counted)."""
        with self._lock:
            rooms = self.rooms()
            return place(rooms, self.cap) or place(rooms) or self.devices[0]

    def choose(self, expected_bytes: int) -> Device:
        """The device for a load expected to take ``expected_bytes`` there, counted as
        placed until :meth:`placed` (the most free one even when all are at their cap:
        the pool's ``device_room`` keeps slots under it)."""
        with self._lock:
            rooms = self.rooms()
            device = place(rooms, self.cap) or place(rooms) or self.devices[0]
            self._placing[device.index].append(expected_bytes)
        return device

    def placed(self, device: Device, expected_bytes: int) -> None:
        """A load :meth:`choose` placed has ended (loaded: its instance counts now)."""
        with self._lock:
            placing = self._placing.get(device.index)
            if placing and expected_bytes in placing:
                placing.remove(expected_bytes)

    def describe(self) -> list[dict[str, object]]:
        """Each GPU: its budget, what is used, its instances (``/v1/node``, start-up)."""
        with self._lock:
            return [
                {
                    "device": str(r.device),
                    "budget_bytes": r.budget_bytes,
                    "used_bytes": r.used_bytes,
                    "instances": r.instances,
                }
                for r in self.rooms()
            ]


def bytes_on(resident: Resident, index: int) -> int:
    """What ``resident``'s loaded instances hold on GPU ``index``."""
    pool = getattr(resident, "pool", None)  # a version's scheduler (runtime/scheduler.py)
    if pool is None:
        return 0
    instances: list[Any] = pool.loaded_instances()
    return sum(i.device_bytes for i in instances if i.device.index == index)


class GpuBudgets(MemoryBudget):
    """The GPU budget of a node with one GPU or more: the sum of each GPU's budget (what
    ``used_bytes`` and ``fits`` weigh), but a load makes room on the GPU placement would
    give it, evicting only what is held there, until it fits that GPU's own budget."""

    def __init__(
        self,
        placement: Placement,
        residents: Callable[[], Iterable[Resident]],
    ) -> None:
        super().__init__(sum(placement.budget_bytes.values()), residents, device_bytes)
        self.placement = placement
        self.per_device = {
            d.index: MemoryBudget(
                placement.budget_bytes[d.index],
                residents,
                lambda r, index=d.index: bytes_on(r, index),  # type: ignore[misc]
            )
            for d in placement.devices
        }

    @property
    def reserved_bytes(self) -> int:
        return sum(budget.reserved_bytes for budget in self.per_device.values())

    async def make_room(
        self, loading: str, needed_bytes: int, below: float | None = None
    ) -> Callable[[], None]:
        budget = self.per_device[self.placement.peek().index]
        budget.appraise, budget.evicted = self.appraise, self.evicted
        return await budget.make_room(loading, needed_bytes, below)
