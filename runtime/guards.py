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
   breaker is open, and counts outcomes (breaker, canary window, kept failures).

The hooks are plain calls that ``Gateway.submit`` makes from its own
coroutine: a guard adds no coroutine frame to the request (each frame is one
more step at every resumption of it, measured on the hot path). Version
choice comes before the guards, the version's admission and queue after
them, and the retry of a retired version around them (``gateway.py``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fnrt.functions.errors import FnrtError
from fnrt.functions.generation import Asked
from fnrt.functions.handler import Request
from fnrt.runtime.clock import Clock
from fnrt.runtime.protection import Served
from fnrt.runtime.queue import Client, Priority
from fnrt.runtime.result_cache import Outputs, SharedResults, inputs_key
from fnrt.runtime.scheduler import Scheduler


@dataclass(slots=True)
class Options:
    """How a request asks to be served (a value: not frozen only because a frozen
    dataclass is four times slower to build, on the request path)."""

    priority: Priority | None = None
    timeout_s: float | None = None
    span: Any = None  # the request's server span (tracing on)
    client: Client | None = None  # its connection (whether the client left)


@dataclass(eq=False, slots=True)
class Call:
    """One request on its way through the guards."""

    scheduler: Scheduler  # the version chosen for it
    inputs: Request
    options: Options
    started: float  # clock time it reached the guards
    split: int | None = None  # a split tail's k
    asked: Asked | None = None  # a generate request's parameters
    answered_by: Scheduler | None = None  # set when another function answered (fallback)
    _key: str | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        """The digest of the inputs (computed once)."""
        if self._key is None:
            self._key = inputs_key(self.inputs)
        return self._key


#: What a guard's ``before`` returns to answer a call itself: the answer, or a
#: coroutine that makes it (a fallback) or finds there is none (None: go on, as a
#: miss of a shared cache).
Answer = Served | Awaitable[Served | None]


class Guard(Protocol):
    def applies(self, scheduler: Scheduler) -> bool:
        """Whether the guard has anything to do for this version (its manifest)."""
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
        looked_up = self._clock.now() - call.started
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
    """While the breaker is open, the fallback answers; otherwise outcomes are counted."""

    def __init__(self, fallback: Fallback) -> None:
        self._fallback = fallback

    def applies(self, scheduler: Scheduler) -> bool:
        return True  # a disabled breaker still counts outcomes (the canary reads them)

    def before(self, call: Call) -> Answer | None:
        if call.scheduler.protection.breaker.allow(call.started):
            return None
        return self._fallback(call)

    def after(self, call: Call, served: Served | None, error: FnrtError | None, now: float) -> None:
        protection = call.scheduler.protection
        if error is not None:
            protection.failed(now, now - call.started, error, call.inputs)
            return
        assert served is not None
        if served.stream is not None:  # a sequence: counted when it ends (sequencer.py)
            return
        protection.succeeded(now, now - call.started)
        if protection.last_results is not None:
            protection.last_results.put(call.key, served.outputs)
