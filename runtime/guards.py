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


@dataclass(frozen=True)
class Options:
    """How a request asks to be served."""

    priority: Priority | None = None
    timeout_s: float | None = None
    span: Any = None  # the request's server span (tracing on)


@dataclass(eq=False)
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
    async def __call__(self, call: Call, proceed: Proceed) -> Served: ...


async def run_guards(guards: Sequence[Guard], call: Call, last: Proceed) -> Served:
    """``call`` through ``guards`` in order, then ``last``."""

    async def step(index: int, current: Call) -> Served:
        if index == len(guards):
            return await last(current)
        return await guards[index](current, lambda c: step(index + 1, c))

    return await step(0, call)


class Invoked(Protocol):
    def invoked(self, name: str) -> None: ...


class KeepAliveGuard:
    """Every call counts for the function's keep-alive and pre-warm history."""

    def __init__(self, keeper: Invoked | None) -> None:
        self._keeper = keeper

    async def __call__(self, call: Call, proceed: Proceed) -> Served:
        if self._keeper is not None:
            self._keeper.invoked(call.scheduler.name)
        return await proceed(call)


class ResultCacheGuard:
    """Inputs seen before are answered from the version's result cache (opt-in)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    async def __call__(self, call: Call, proceed: Proceed) -> Served:
        scheduler = call.scheduler
        cache = scheduler.protection.result_cache
        if cache is None:
            return await proceed(call)
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
