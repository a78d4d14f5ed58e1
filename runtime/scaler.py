"""When one version's pool adds an instance and which idle ones it drops.

The decisions are :mod:`fnrt.runtime.scaling`'s pure functions; :class:`Scaler`
adds what they need remembered (since when the queue has been deep) and the
node's cap on instances sharing a GPU. It reads the pool's slots and changes
none of them: the pool acts on what it says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from fnrt.functions.manifest import Manifest
from fnrt.runtime.scaling import Activity, should_add_instance, should_unload
from fnrt.runtime.slots import SlotView

S = TypeVar("S", bound=SlotView)


class Scaler:
    """Scale-up and scale-down decisions of one version's pool."""

    def __init__(self, manifest: Manifest, device_room: Callable[[], bool] | None = None) -> None:
        self._scaling = manifest.scaling
        self._max_batch_size = manifest.batching.max_batch_size
        self._device_room = device_room  # None: no cap on instances sharing the GPU
        self._deep_since: float | None = None

    def wants_another(
        self,
        slots: Sequence[SlotView],
        loading: bool,
        queued: int,
        now: float,
        batch_size: int | None = None,
    ) -> bool:
        """Whether the queue has been deep long enough for one more instance (deep: a
        batch of ``batch_size``, by default ``max_batch_size``, waits)."""
        size = batch_size or self._max_batch_size
        if queued >= size:
            self._deep_since = self._deep_since if self._deep_since is not None else now
        else:
            self._deep_since = None
        if self._device_room is not None and not self._device_room():
            return False  # --gpu-concurrency: the GPU has as many instances as it shares
        return should_add_instance(
            self._scaling,
            instances=len(slots),
            loading=loading,
            queued=queued,
            batch_size=size,
            deep_since_s=self._deep_since,
            now=now,
        )

    def idle(
        self,
        slots: Sequence[S],
        queued: int,
        now: float,
        *,
        force: bool = False,
        keep_primary: bool = False,
    ) -> list[S]:
        """The loaded slots to drop now, the newest first: extra ones idle for
        ``scale_down_after_s``, the first idle for ``keep_alive_s`` (never below
        ``min_instances``; ``keep_primary``: the keep-alive policy decides for the
        first); ``force``: every idle one."""
        scaling = self._scaling
        instances = sum(1 for s in slots if s.instance is not None)
        chosen = []
        for slot in sorted(slots, key=lambda s: -s.index):
            if slot.instance is None:
                continue
            if not force and instances <= scaling.min_instances:
                break
            if slot.primary and keep_primary:
                continue
            keep = scaling.keep_alive_s if slot.primary else scaling.scale_down_after_s
            activity = Activity(True, slot.running, queued, slot.last_active)
            idle = not activity.busy and not activity.queued
            if (force and idle) or should_unload(keep, activity, now):
                chosen.append(slot)
                instances -= 1
        return chosen
