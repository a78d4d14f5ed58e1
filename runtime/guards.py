"""The guards every data request passes, in one order, inside ``Gateway.submit``.

A guard looks at a request (:class:`Call`) before it is queued, and may answer
it there (a cache hit, a fallback); once the request is answered, the guards
it passed see the outcome, in reverse order, like middleware unwinding. In
order:

1. :class:`KeepAliveGuard` tells the keep-alive keeper a call came (pre-warm
   predictions learn from it);
2. :class:`ResultCacheGuard` answers repeated inputs from the version's cache,
   and keeps what the version computed;
3. :class:`BreakerGuard` sends calls to the fallback while the version's
   breaker is open, and keeps the last result per input for its "cache" fallback.

The hooks are plain calls. While no guard that applies to a version watches
outcomes (the default: keep-alive and the breaker's check only), ``Gateway.submit``
makes its ``before`` calls and hands the call to the queue with no coroutine of
its own; otherwise the outcome comes back through its coroutine. Outcomes are
counted per batch, where they happen (``intake.py``): the breaker, the
canary's window and kept failures. Version choice and the input check come
before the guards (``http/data.py``), the version's admission and queue after
them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from fnrt.functions.errors import FnrtError
from fnrt.runtime.clock import Clock
from fnrt.runtime.protection import Served
from fnrt.runtime.queue import Call
from fnrt.runtime.result_cache import Outputs, SharedResults
from fnrt.runtime.scheduler import Scheduler

#: What a guard's ``before`` returns to answer a call itself: the answer, or a
#: coroutine that makes it (a fallback) or finds there is none (None: go on, as a
#: miss of a shared cache).
Answer = Served | Awaitable[Served | None]


class Guard(Protocol):
    def applies(self, scheduler: Scheduler) -> bool:
        """Whether the guard has anything to do for this version (its manifest)."""
        ...

    def watches(self, scheduler: Scheduler) -> bool:
        """Whether its ``after`` has anything to do for this version: while no guard
        that applies watches, a call is queued without a coroutine of the gateway's."""
        ...

    def before(self, call: Call) -> Answer | None:
        """None to let the call go on; or its answer."""
        ...

    def after(self, call: Call, served: Served | None, error: FnrtError | None, now: float) -> None:
        """The outcome of a call this guard let through (``served`` or ``error``)."""
        ...


class Invoked(Protocol):
    def invoked(self, name: str) -> None: ...


class KeepAliveGuard:
    """Every call counts for the function's keep-alive and pre-warm history."""

    def __init__(self, keeper: Invoked | None) -> None:
        self._keeper = keeper

    def applies(self, scheduler: Scheduler) -> bool:
        return self._keeper is not None

    def watches(self, scheduler: Scheduler) -> bool:
        return False

    def before(self, call: Call) -> Answer | None:
        assert self._keeper is not None
        self._keeper.invoked(call.scheduler.name)
        return None

    def after(self, call: Call, served: Served | None, error: FnrtError | None, now: float) -> None:
        pass


class ResultCacheGuard:
    """Inputs seen before are answered from the version's result cache (opt-in)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def applies(self, scheduler: Scheduler) -> bool:
        return scheduler.protection.result_cache is not None

    def watches(self, scheduler: Scheduler) -> bool:
        return True  # it keeps what the version computed

    def before(self, call: Call) -> Answer | None:
        cache = call.scheduler.protection.result_cache
        assert cache is not None
        if isinstance(cache, SharedResults):  # a round trip to Redis
            return self._shared(call, cache)
        return self._answer(call, cache.get(call.key))

    async def _shared(self, call: Call, cache: SharedResults) -> Served | None:
        return self._answer(call, await cache.get(call.key))

    def _answer(self, call: Call, hit: Outputs | None) -> Served | None:
        scheduler = call.scheduler
        looked_up = self._clock.now() - call.enqueued_at
        totals = scheduler.stats.totals
        if hit is None:
            totals.cache_miss.add(looked_up)
            return None
        totals.cache_hit.add(looked_up)
        totals.success.add(looked_up)
        totals.last_request_unix_s = time.time()
        return Served(hit, cached=True)

    def after(self, call: Call, served: Served | None, error: FnrtError | None, now: float) -> None:
        cache = call.scheduler.protection.result_cache
        if served is not None and served.fallback is None and cache is not None:
            cache.put(call.key, served.outputs)  # what this version computed, not a fallback's


#: Answers a call whose version's breaker is open (the gateway's fallback).
Fallback = Callable[[Call], Awaitable[Served]]


class BreakerGuard:
    """While the breaker is open, the fallback answers. Outcomes are counted per batch
    where they happen (``intake.py``: the breaker, the canary's window, kept failures,
    for the calls the gateway let through); this guard keeps the last result per input
    for a ``fallback = "cache"``."""

    def __init__(self, fallback: Fallback) -> None:
        self._fallback = fallback

    def applies(self, scheduler: Scheduler) -> bool:
        return True  # the breaker may open whatever the manifest says

    def watches(self, scheduler: Scheduler) -> bool:
        return scheduler.protection.last_results is not None

    def before(self, call: Call) -> Answer | None:
        if call.scheduler.protection.breaker.allow(call.enqueued_at):
            return None
        return self._fallback(call)

    def after(self, call: Call, served: Served | None, error: FnrtError | None, now: float) -> None:
        last_results = call.scheduler.protection.last_results
        if served is not None and served.stream is None and last_results is not None:
            last_results.put(call.key, served.outputs)
