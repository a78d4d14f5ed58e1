"""The guards every data request passes, in one order, inside ``Gateway.submit``.

Each guard is an object called with the request (:class:`Call`) and the rest
of the chain (``proceed``); it may answer without proceeding (a cache hit, a
fallback), or proceed and look at the outcome. In order:

1. :class:`KeepAliveGuard` tells the keep-alive keeper a call came (pre-warm
   predictions learn from it);
2. :class:`ResultCacheGuard` answers repeated inputs from the version's cache;
3. :class:`BreakerGuard` sends calls to the fallback while the version's
   breaker is open, and counts outcomes (breaker, canary window, kept failures).

The end of the chain is the scheduler's own admission and queue. Version
choice comes before the chain and the retry of a retired version after it
(``gateway.py``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fnrt.functions.errors import FnrtError
from fnrt.functions.handler import Request
from fnrt.runtime.clock import Clock
from fnrt.runtime.protection import Served
from fnrt.runtime.queue import Priority
from fnrt.runtime.result_cache import inputs_key
from fnrt.runtime.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class Options:
    """How a request asks to be served."""

    priority: Priority | None = None
    timeout_s: float | None = None
    span: Any = None  # the request's server span (tracing on)


@dataclass(eq=False, slots=True)
class Call:
    """One request on its way through the guards."""

    scheduler: Scheduler  # the version chosen for it
    inputs: Request
    options: Options
    split: int | None = None  # a split tail's k
    answered_by: Scheduler | None = None  # set when another function answered (fallback)
    _key: str | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        """The digest of the inputs (computed once)."""
        if self._key is None:
            self._key = inputs_key(self.inputs)
        return self._key


Proceed = Callable[[Call], Awaitable[Served]]


class Guard(Protocol):
    """A step of the chain. One with nothing to do after ``proceed`` returns its
    awaitable directly (not a coroutine of its own): every coroutine in the chain
    is a frame each resumption of the request passes through."""

    def applies(self, scheduler: Scheduler) -> bool:
        """Whether the guard has anything to do for this version (its manifest)."""
        ...

    def __call__(self, call: Call, proceed: Proceed) -> Awaitable[Served]: ...


def chain(guards: Sequence[Guard], scheduler: Scheduler, last: Proceed) -> Proceed:
    """One callable that takes a call to ``scheduler`` through the ``guards`` that
    apply to it, in order, then ``last``. Composed once per version, so a request
    allocates nothing and passes only the guards that have work for it."""
    proceed = last
    for guard in reversed(guards):
        if guard.applies(scheduler):
            proceed = functools.partial(guard, proceed=proceed)
    return proceed


class Invoked(Protocol):
    def invoked(self, name: str) -> None: ...


class KeepAliveGuard:
    """Every call counts for the function's keep-alive and pre-warm history."""

    def __init__(self, keeper: Invoked | None) -> None:
        self._keeper = keeper

    def applies(self, scheduler: Scheduler) -> bool:
        return self._keeper is not None

    def __call__(self, call: Call, proceed: Proceed) -> Awaitable[Served]:
        assert self._keeper is not None
        self._keeper.invoked(call.scheduler.name)
        return proceed(call)


class ResultCacheGuard:
    """Inputs seen before are answered from the version's result cache (opt-in)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def applies(self, scheduler: Scheduler) -> bool:
        return scheduler.protection.result_cache is not None

    async def __call__(self, call: Call, proceed: Proceed) -> Served:
        scheduler = call.scheduler
        cache = scheduler.protection.result_cache
        assert cache is not None
        started = self._clock.now()
        hit = cache.get(call.key)
        looked_up = self._clock.now() - started
        totals = scheduler.stats.totals
        if hit is not None:
            totals.cache_hit.add(looked_up)
            totals.success.add(looked_up)
            totals.last_request_unix_s = time.time()
            return Served(hit, cached=True)
        totals.cache_miss.add(looked_up)
        served = await proceed(call)
        cache.put(call.key, served.outputs)
        return served


#: Answers a call whose version's breaker is open (the gateway's fallback).
Fallback = Callable[[Call], Awaitable[Served]]


class BreakerGuard:
    """While the breaker is open, the fallback answers; otherwise outcomes are counted."""

    def __init__(self, clock: Clock, fallback: Fallback) -> None:
        self._clock = clock
        self._fallback = fallback

    def applies(self, scheduler: Scheduler) -> bool:
        return True  # a disabled breaker still counts outcomes (the canary reads them)

    async def __call__(self, call: Call, proceed: Proceed) -> Served:
        protection = call.scheduler.protection
        started = self._clock.now()
        if not protection.breaker.allow(started):
            return await self._fallback(call)
        try:
            served = await proceed(call)
        except FnrtError as exc:
            now = self._clock.now()
            protection.failed(now, now - started, exc, call.inputs)
            raise
        now = self._clock.now()
        protection.succeeded(now, now - started)
        if protection.last_results is not None:
            protection.last_results.put(call.key, served.outputs)
        return served
