"""The one way in: every data route (invoke, OIP infer, split tails) calls
:meth:`Gateway.submit`.

In order, a request gets: the version chosen (the routing's split, a sticky
key, a pinned version, or a split tail of one), the guards (``guards.py``:
keep-alive accounting, result cache, breaker and fallback), the version's
admission and queue, and, when the version retired between choosing and
queueing, one more try on the version that replaced it. A guard added to the
chain applies to every route at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from fnrt.functions.errors import FnrtError, VersionRetired
from fnrt.functions.generation import Asked
from fnrt.functions.handler import Request
from fnrt.functions.version import VersionManifest
from fnrt.runtime.clock import Clock
from fnrt.runtime.guards import (
    BreakerGuard,
    Call,
    Guard,
    Invoked,
    KeepAliveGuard,
    Options,
    ResultCacheGuard,
)
from fnrt.runtime.protection import Served
from fnrt.runtime.queue import Priority
from fnrt.runtime.registry import Registry
from fnrt.runtime.scheduler import Scheduler
from fnrt.runtime.split import ACTIVATION, Splits

__all__ = ["ACTIVATION", "Answered", "Decode", "Decoded", "Gateway", "Options", "Target"]


# The request-path records below are plain slotted dataclasses, not frozen ones: a
# frozen dataclass takes about four times as long to build, and a request builds
# several. Treat them as values all the same.


@dataclass(slots=True)
class Decoded:
    """A request's body decoded for the version chosen to answer it."""

    inputs: Request
    priority: Priority | None = None  # asked for in the body (OIP parameters): headers win
    timeout_s: float | None = None
    asked: Asked | None = None  # a generate request's parameters, checked for the version


#: Turns the request's body into inputs for the version chosen to answer it.
Decode = Callable[[VersionManifest], Decoded]


@dataclass(slots=True)
class Target:
    """What a request asks for: a function, maybe a pinned version or a split tail."""

    function: str
    version: str | None = None  # pinned (OIP's /versions/{v}, a device's head version)
    split: int | None = None  # the tail of split k (inputs: {ACTIVATION: array})
    headers: Mapping[str, str] | None = None  # the request's (a sticky header picks)


@dataclass(slots=True)
class Answered:
    """Who answered a request (the fallback function's scheduler, when it did), and how."""

    scheduler: Scheduler
    served: Served


class Gateway:
    """Version choice, the guards, and the retired-version retry for every data route."""

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

    async def submit(self, target: Target, decode: Decode, options: Options) -> Answered:
        """Answer one request. ``decode`` turns its body into inputs for the chosen
        version (so inputs are checked against the version that runs them)."""
        scheduler = self.choose_now(target)
        if scheduler is None:
            scheduler = await self.choose(target)
        for retried in (False, True):
            call = self._call(target, scheduler, decode, options)
            protection = scheduler.protection
            guards = protection.guards
            if guards is None:  # the guards that apply to this version, chosen once
                guards = protection.guards = tuple(g for g in self.guards if g.applies(scheduler))
                protection.unwind = guards[::-1]
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
                    served = await _queue(scheduler, call)
            except FnrtError as exc:
                now = self._clock.now()
                for guard in _passed(protection.unwind, passed):
                    guard.after(call, None, exc, now)
                if not isinstance(exc, VersionRetired) or retried or target.version is not None:
                    raise  # a pinned version has no other to answer
                successor = await self.choose(target)
                if successor is scheduler:
                    raise
                scheduler = successor
                continue
            if passed:
                now = self._clock.now()
                for guard in _passed(protection.unwind, passed):
                    guard.after(call, served, None, now)
            return Answered(call.answered_by or scheduler, served)
        raise AssertionError("unreachable: the second try returns or raises")

    def _call(self, target: Target, scheduler: Scheduler, decode: Decode, options: Options) -> Call:
        decoded = decode(scheduler.version)
        inputs = decoded.inputs
        if target.split is not None:
            inputs = self._splits.tail_inputs(scheduler.version, target.split, inputs)
        if (decoded.priority is not None and options.priority is None) or (
            decoded.timeout_s is not None and options.timeout_s is None
        ):
            options = Options(
                decoded.priority if options.priority is None else options.priority,
                decoded.timeout_s if options.timeout_s is None else options.timeout_s,
                options.span,
                options.client,
            )
        return Call(scheduler, inputs, options, self._clock.now(), target.split, decoded.asked)

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
                served = await _queue(other, call)
                call.answered_by = other
                return Served(served.outputs, served.cold_tier, fallback=config.fallback)
        raise protection.refusal(scheduler.name, scheduler.version.version, self._clock.now())


def _passed(unwind: tuple[Guard, ...], passed: int) -> tuple[Guard, ...]:
    """The guards a call went through (the first ``passed``), in reverse order."""
    return unwind if passed == len(unwind) else unwind[len(unwind) - passed :]


def _queue(scheduler: Scheduler, call: Call) -> Awaitable[Served]:
    """``call`` into ``scheduler``'s admission and queue (the end of the guards)."""
    options = call.options
    return scheduler.submit(
        call.inputs,
        priority=options.priority,
        timeout_s=options.timeout_s,
        span=options.span,
        now=call.started,
        client=options.client,
        asked=call.asked,
    )
