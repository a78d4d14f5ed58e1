"""The full garbage collections that free unloaded thread instances: one for the unloads
of a moment, not one each.

A model loaded in the server's process (thread isolation) is frozen out of the
collector at its load (``Loads.loaded``), so that per-request garbage never
triggers a full collection that walks it. Freeing what such a model holds in
reference cycles then takes ``gc.unfreeze()`` and a full collection, which walks
every object of the server while holding the GIL: about 50 ms with torch
imported, more with every function the node has served, and the event loop
waits meanwhile. The sweep unloads every instance whose keep-alive ran out in one
pass, and a load short of memory evicts several: one collection each stalled the
loop that many times.

So an unload asks the :class:`Collector` for a collection within ``delay_s``; the
unloads that come meanwhile share it. A load first runs the one still pending
(:meth:`Collector.settle`), so what was unloaded to make room for it is freed
before the new model is loaded, as before. What a model frees by reference count
alone (most do) is freed at its unload, as before.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("fnrt.collector")

#: How long an unload's collection waits for others to share it: the sweep's pass
#: unloads all it finds within a second.
COLLECT_DELAY_S = 1.0


def collect_frozen() -> None:
    """A full collection of everything, what was frozen included, then freeze again;
    what a model freed on a GPU then goes back to the device."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    empty_device_cache()


def empty_device_cache() -> None:
    """Give torch's cached GPU blocks back to the device, where torch uses one."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class Collector:
    """Runs ``collect`` once within ``delay_s`` of one or more unloads (any thread)."""

    def __init__(
        self, delay_s: float = COLLECT_DELAY_S, collect: Callable[[], None] = collect_frozen
    ) -> None:
        #: how long an unload's collection waits for others to share it
        self.delay_s = delay_s
        self._collect = collect
        self._lock = threading.Lock()  # guards _timer
        self._collecting = threading.Lock()  # one collection at a time
        self._timer: threading.Timer | None = None

    @property
    def pending(self) -> bool:
        """Whether an unload's collection is still to run, or running (a load then waits
        for it in :meth:`settle`)."""
        return self._timer is not None or self._collecting.locked()

    def unloaded(self) -> None:
        """A thread instance was closed: collect within ``delay_s``, sharing the
        collection with the unloads that come meanwhile."""
        with self._lock:
            if self._timer is not None:
                return
            timer = threading.Timer(self.delay_s, self.settle)
            timer.daemon = True  # a node stopping does not wait for it
            timer.name = "fnrt-collect"
            self._timer = timer
        timer.start()

    def freeze(self) -> None:
        """Freeze every object out of the collector (a model just loaded here), never
        between a collection's ``unfreeze`` and its ``collect``: what that collection is
        to free would be frozen again."""
        with self._collecting:
            gc.freeze()

    def settle(self) -> None:
        """Run the pending collection now, if any, or wait for the one running (before a
        load: what was unloaded is freed before another model takes its memory).
        Blocking: call it off the loop. A collection that fails is logged, never the
        caller's error (the load that asked is another function's)."""
        with self._collecting:
            with self._lock:
                timer, self._timer = self._timer, None
            if timer is None:
                return
            timer.cancel()  # (the timer's own thread calling: it has fired already)
            try:
                self._collect()
            except Exception:  # a device's error from empty_cache, say
                log.exception("collecting what unloaded instances left failed")


#: The process's collector: the garbage collector it drives is the process's.
COLLECTOR = Collector()
