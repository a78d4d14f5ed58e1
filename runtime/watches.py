"""The watches on the files a version's live instances map (``fnrt.loader.scrub``).

A load opens its instance's watch on the load's own thread, right after the
instance is made (:meth:`FileWatches.open`: no thread hop of its own on a cold
start), and the pool hands both here once the instance is in its slot
(:meth:`FileWatches.adopt`); a change found by the scrub's
thread comes back to the event loop, where an idle instance is retired at once
(a running one when its batch ends, whose answers are not served: the pool
asks :meth:`FileWatches.found` after each batch and before handing out an
instance). Retiring is the pool's: this part only says when.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from fnrt.functions.version import VersionManifest
from fnrt.loader.instance import Runnable
from fnrt.loader.scrub import Watch
from fnrt.runtime.slots import SlotView

#: Starts watching the files a version's instance maps, after its load (blocking; None:
#: nothing watches them). ``InstanceLoader.watch_files``.
WatchFiles = Callable[[VersionManifest], Watch | None]


#: The pool's retirement of a slot's instance whose files changed (and its reload).
Retire = Callable[[Any, Runnable], Coroutine[Any, Any, None]]


class FileWatches:
    """One watch per slot whose instance maps files, by slot index."""

    def __init__(self, version: VersionManifest, watch_files: WatchFiles | None, retire: Retire):
        self._version = version
        self._watch_files = watch_files
        self._retire = retire
        self._by_slot: dict[int, Watch] = {}
        self._retiring: set[asyncio.Future[None]] = set()  # instances whose files changed

    def open(self) -> Watch | None:
        """Start watching the files an instance of the version maps (blocking: on the
        load's own thread, right after the load), or None when nothing watches them."""
        if self._watch_files is None:
            return None
        return self._watch_files(self._version)

    def adopt(self, slot: SlotView, instance: Runnable, watch: Watch | None) -> None:
        """Keep ``watch`` (:meth:`open`'s) for ``instance``, just loaded into ``slot``: a
        change found retires it at once."""
        if watch is None:
            return
        loop = asyncio.get_running_loop()
        self._by_slot[slot.index] = watch

        def changed(reason: str) -> None:  # from the scrub's thread
            loop.call_soon_threadsafe(self._changed_under, slot, instance)

        watch.on_change = changed

    def _changed_under(self, slot: SlotView, instance: Runnable) -> None:
        """A file the instance maps changed: an idle instance is retired now (a running
        one when its batch ends)."""
        if slot.instance is instance and not slot.running:
            future = asyncio.ensure_future(self._retire(slot, instance))
            self._retiring.add(future)
            future.add_done_callback(self._retiring.discard)

    def found(self, slot: SlotView) -> str | None:
        """Why the files of the slot's instance changed ("" when the scrub gave no
        reason), or None while they have not (or nothing watches them)."""
        watch = self._by_slot.get(slot.index)
        if watch is None or watch.check() is None:
            return None
        return watch.reason or ""

    def stop(self, slot: SlotView) -> str | None:
        """Stop watching the slot's files (its instance is gone); why they changed, if
        they had."""
        watch = self._by_slot.pop(slot.index, None)
        if watch is None:
            return None
        watch.close()
        return watch.reason or None
