"""The one way in: every data route (invoke, OIP infer, split tails, generate) goes
through the gateway, in one template (``http/data.py``'s ``serve_data``).

In order, a request gets: the version chosen (:meth:`Gateway.choose_now` or
:meth:`Gateway.choose`: the routing's split, a sticky key, a pinned version, or
a split tail of one), its body decoded and checked against that version and
built into its one record (:meth:`Gateway.call`, a
:class:`~fnrt.runtime.queue.Call`, which is also its queue entry), then
:meth:`Gateway.submit`: the guards (``guards.py``: keep-alive accounting,
result cache, breaker and fallback) and the version's admission and queue.
When the version retired between choice and queue, :meth:`Gateway.successor`
names the version that replaced it, and the template tries once more there.
A guard added to the chain applies to every route at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any

from fnrt.functions.errors import FnrtError, VersionRetired
from fnrt.functions.generation import Asked
from fnrt.functions.handler import Request
from fnrt.runtime.clock import Clock
from fnrt.runtime.guards import (
    Answer,
    BreakerGuard,
    Guard,
    Invoked,
    KeepAliveGuard,
    ResultCacheGuard,
)
from fnrt.runtime.protection import Served
from fnrt.runtime.queue import Call, Client, Priority
from fnrt.runtime.registry import Registry
from fnrt.runtime.scheduler import Scheduler
from fnrt.runtime.split import ACTIVATION, Splits

__all__ = ["ACTIVATION", "Gateway", "Target"]


@dataclass(slots=True)
class Target:
    """What a request asks for: a function, maybe a pinned version or a split tail."""

    function: str
    version: str | None = None  # pinned (OIP's /versions/{v}, a device's head version)
    split: int | None = None  # the tail of split k (inputs: {ACTIVATION: array})
    headers: Mapping[str, str] | None = None  # the request's (a sticky header picks)


class Gateway:
    """Version choice, the request record, and the guards, for every data route."""

    def __init__(
        self,
        registry: Registry,
        splits: Splits,
        clock: Clock,
        keeper: Invoked | None = None,
    ) -> None:
        self._registry = registry
        self._splits = splits
        self._clock = clock
        self.guards: tuple[Guard, ...] = (
            KeepAliveGuard(keeper),
            ResultCacheGuard(clock),
            BreakerGuard(self._fallback),
        )

    def choose(self, target: Target) -> Awaitable[Scheduler]:
        """The scheduler that answers ``target`` now (to await)."""
        if target.split is not None:
            return self._splits.tail(target.function, target.split, target.version)
        if target.version is not None:
            return self._registry.get_version(target.function, target.version)
        return self._registry.route(target.function, target.headers)

    def choose_now(self, target: Target) -> Scheduler | None:
        """:meth:`choose` where no wait is needed (a function already served here, no
        pinned version or split tail: the usual request); None otherwise."""
        if target.split is None and target.version is None:
            return self._registry.route_now(target.function, target.headers)
        return None

    async def successor(self, target: Target, retired: Scheduler) -> Scheduler:
        """The version that answers ``target`` in place of ``retired``, which retired
        between choice and queue; VersionRetired again if there is none (a pinned one)."""
        if target.version is None:
            successor = await self.choose(target)
            if successor is not retired:
                return successor
        raise VersionRetired(
            f"function '{retired.name}' version {retired.version.version} is shutting down"
        )

    def call(
        self,
        scheduler: Scheduler,
        inputs: Request,
        priority: Priority | None = None,
        timeout_s: float | None = None,
        *,
        span: Any = None,
        client: Client | None = None,
        split: int | None = None,
        asked: Asked | None = None,
    ) -> Call:
        """The record of one data request for ``scheduler``'s version, its ``inputs``
        checked against that version: the one object that goes on to the guards, the
        queue and the batch. A split tail's activation becomes the tail's inputs."""
        if split is not None:
            inputs = self._splits.tail_inputs(scheduler.version, split, inputs)
        return scheduler.batcher.call(
            inputs,
            self._clock.now(),
            priority,
            timeout_s,
            span=span,
            client=client,
            counted=True,
            scheduler=scheduler,
            split=split,
            asked=asked,
        )

    def submit(self, call: Call) -> Awaitable[Served]:
        """The guards, then the version's admission and queue: what waits for the answer.
        Raises at once what admission refuses (VersionRetired among them: the caller
        tries :meth:`successor`). While no guard that applies watches outcomes (the
        default), this is a plain call: no coroutine between the route and the queue."""
        scheduler: Scheduler = call.scheduler
        protection = scheduler.protection
        guards = protection.guards
        if guards is None:  # the guards that apply to this version, chosen once
            guards = protection.guards = tuple(g for g in self.guards if g.applies(scheduler))
            watching = any(g.watches(scheduler) for g in guards)
            protection.unwind = guards[::-1] if watching else ()
        if protection.unwind:
            return self._guarded(call, guards, protection.unwind)
        for guard in guards:
            answer = guard.before(call)
            if answer is not None:
                return _answered(answer, call)
        return scheduler.batcher.submit(call)

    async def _guarded(
        self, call: Call, guards: tuple[Guard, ...], unwind: tuple[Guard, ...]
    ) -> Served:
        """:meth:`submit` with guards that see the outcome, in reverse order."""
        passed = 0  # guards the call went through: they see its outcome
        try:
            for guard in guards:
                answer = guard.before(call)
                if answer is not None:
                    found = answer if isinstance(answer, Served) else await answer
                    if found is not None:
                        served = found
                        break
                passed += 1
            else:
                served = await call.scheduler.batcher.submit(call)
        except FnrtError as exc:
            now = self._clock.now()
            for guard in _passed(unwind, passed):
                guard.after(call, None, exc, now)
            raise
        if passed:
            now = self._clock.now()
            for guard in _passed(unwind, passed):
                guard.after(call, served, None, now)
        return served

    async def _fallback(self, call: Call) -> Served:
        """Answer while the version's breaker is open: the last result for the same
        inputs, another function, or CircuitOpen (503 with Retry-After)."""
        scheduler = call.scheduler
        protection = scheduler.protection
        config = scheduler.version.manifest.breaker
        if protection.last_results is not None:
            hit = protection.last_results.get(call.key)
            if hit is not None:
                return Served(hit, cached=True, fallback="cache")
        other_name = config.fallback_function
        if other_name is not None and other_name != scheduler.name and call.split is None:
            other = await self.choose(Target(other_name))
            if other.protection.breaker.allow(self._clock.now()):
                instead = other.batcher.call(
                    call.inputs,
                    call.enqueued_at,
                    call.priority,
                    span=call.span,
                    client=call.client,
                    counted=True,
                    scheduler=other,
                )
                served = await other.batcher.submit(instead)
                call.answered_by = other
                return Served(served.outputs, served.cold_tier, fallback=config.fallback)
        raise protection.refusal(scheduler.name, scheduler.version.version, self._clock.now())


def _answered(answer: Answer, call: Call) -> Awaitable[Served]:
    """A guard's answer as something to await (its own coroutine, or a done future)."""
    if isinstance(answer, Served):
        future: asyncio.Future[Served] = asyncio.get_running_loop().create_future()
        future.set_result(answer)
        return future
    return _found(answer, call)


async def _found(answer: Awaitable[Served | None], call: Call) -> Served:
    served = await answer
    if served is None:  # a guard found nothing after all: on to the queue
        scheduler: Scheduler = call.scheduler
        return await scheduler.batcher.submit(call)
    return served


def _passed(unwind: tuple[Guard, ...], passed: int) -> tuple[Guard, ...]:
    """The guards a call went through (the first ``passed``), in reverse order."""
    return unwind if passed == len(unwind) else unwind[len(unwind) - passed :]
