"""Rolling a new version out: blue/green preparation, then the canary walk.

:func:`prepare` loads the new version, runs its warm-up requests and its
correctness probe before it gets any traffic; any failure is a
DeployRejected and the serving version is untouched. :class:`Canary` then
moves traffic step by step, judged by :func:`fnrt.runtime.traffic.judge_canary`,
and moves it back on its own when the new version does worse.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from fnrt.functions.errors import DeployRejected, FnrtError
from fnrt.functions.manifest import RolloutConfig
from fnrt.functions.tensors import coerce_request
from fnrt.loader.instance import InstanceLoader
from fnrt.runtime import scheduler as sched
from fnrt.runtime.clock import Clock
from fnrt.runtime.scheduler import Scheduler
from fnrt.runtime.traffic import Verdict, canary_traffic, judge_canary

log = logging.getLogger("fnrt.rollout")

#: How often a canary step is judged.
JUDGE_INTERVAL_S = 0.25


def _requests(path: Path, what: str) -> list[Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{what} {path.name!r} cannot be read: {exc}") from None
    return data if isinstance(data, list) else [data]


async def prepare(scheduler: Scheduler, loader: InstanceLoader) -> dict[str, Any]:
    """Load ``scheduler``'s version and run its warm-up and probe; what ran, for the reply.

    Raises DeployRejected naming the step that failed.
    """
    vm = scheduler.version
    config = vm.manifest.rollout
    specs = vm.manifest.inputs

    def rejected(reason: str) -> DeployRejected:
        return DeployRejected(vm.name, vm.version, reason)

    try:
        await sched.warm(scheduler)
    except FnrtError as exc:
        raise rejected(f"it failed to load: {exc.message}") from None
    checks: dict[str, Any] = {"loaded": True}
    code = await asyncio.to_thread(loader.code_dir, vm)
    if config.warmup_file:
        try:
            warmups = _requests(code / config.warmup_file, "warmup_file")
            for raw in warmups:
                await sched.submit(scheduler, coerce_request(specs, _inputs_of(raw)))
        except (FnrtError, ValueError, TypeError) as exc:
            raise rejected(f"warm-up failed: {_why(exc)}") from None
        checks["warmup_requests"] = len(warmups)
    if config.probe_file:
        try:
            probes = _requests(code / config.probe_file, "probe_file")
            for i, probe in enumerate(probes):
                if not isinstance(probe, Mapping) or not isinstance(probe.get("outputs"), Mapping):
                    raise ValueError(f"probe {i} needs 'inputs' and 'outputs' objects")
                served = await sched.submit(scheduler, coerce_request(specs, _inputs_of(probe)))
                mismatch = compare(served.outputs, probe["outputs"], config)
                if mismatch:
                    raise ValueError(f"probe {i}: {mismatch}")
        except (FnrtError, ValueError, TypeError) as exc:
            raise rejected(f"probe failed: {_why(exc)}") from None
        checks["probes_passed"] = len(probes)
    return checks


def _inputs_of(raw: Any) -> dict[str, Any]:
    """A warm-up or probe entry's inputs: ``{"inputs": {...}}`` or the inputs themselves."""
    inputs = raw.get("inputs", raw) if isinstance(raw, Mapping) else None
    if not isinstance(inputs, Mapping):
        raise ValueError("each request must be an object of inputs")
    return dict(inputs)


def _why(exc: Exception) -> str:
    return exc.message if isinstance(exc, FnrtError) else str(exc)


def compare(
    outputs: Mapping[str, np.ndarray[Any, Any]], expected: Mapping[str, Any], config: RolloutConfig
) -> str:
    """Empty when every expected output matches within tolerance, else what differs."""
    for name, want in expected.items():
        if name not in outputs:
            return f"no output '{name}'"
        got = outputs[name]
        try:
            wanted = np.asarray(want, dtype=np.float64)
            have = got.astype(np.float64)
        except (TypeError, ValueError):
            if got.tolist() != want:
                return f"output '{name}' differs"
            continue
        if have.shape != wanted.shape:
            return f"output '{name}' has shape {list(have.shape)}, expected {list(wanted.shape)}"
        if not np.allclose(have, wanted, atol=config.probe_atol, rtol=config.probe_rtol):
            worst = float(np.max(np.abs(have - wanted))) if have.size else math.nan
            return (
                f"output '{name}' is off by up to {worst:.3g} "
                f"(atol {config.probe_atol}, rtol {config.probe_rtol})"
            )
    return ""


#: Writes a split for the function; returns False when the routing was changed by
#: someone else meanwhile (the canary then stops).
SetTraffic = Callable[[dict[str, int], str], Awaitable[bool]]


class RolloutState(StrEnum):
    RUNNING = "running"
    DONE = "done"
    STOPPED = "stopped"  # cancelled: another deploy, a hand-set split, the server stopping
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"  # the store failed under it: the split stays as it was


class RolloutPolicy(StrEnum):
    IMMEDIATE = "immediate"
    CANARY = "canary"


@dataclass
class RolloutStatus:
    """A rollout under way or last finished, as ``describe`` and ``versions`` show it."""

    policy: RolloutPolicy
    to: str
    state: RolloutState
    source: str | None = None  # the version it started from ("from")
    percent: int | None = None
    reason: str | None = None
    started_unix_s: float | None = None
    finished_unix_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policy": self.policy.value}
        if self.source is not None:
            out["from"] = self.source
        out.update(to=self.to, state=self.state.value)
        for key in ("percent", "reason", "started_unix_s", "finished_unix_s"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclass
class Canary:
    """One canary rollout in progress: ``candidate`` takes over from ``baseline``."""

    baseline: Scheduler
    candidate: Scheduler
    config: RolloutConfig
    clock: Clock
    set_traffic: SetTraffic
    status: RolloutStatus = field(init=False)
    task: asyncio.Task[None] | None = None
    #: Set once the first step's split is written (or the rollout ended before it).
    first_step: asyncio.Event = field(default_factory=asyncio.Event)
    #: The split this canary last wrote (at its start, the one it found): a step writes
    #: only over it, so that a change made elsewhere meanwhile stops the canary.
    written: dict[str, int] = field(default_factory=dict)
    #: A split being written: :meth:`cancel` waits for it (a write on a thread goes on).
    writing: asyncio.Future[Any] | None = None

    def __post_init__(self) -> None:
        self.status = RolloutStatus(
            RolloutPolicy.CANARY,
            self.candidate.version.version,
            RolloutState.RUNNING,
            source=self.baseline.version.version,
            percent=0,
            started_unix_s=_unix(),
        )

    def start(self) -> None:
        self.task = asyncio.ensure_future(self._run())
        self.task.add_done_callback(lambda _: self.first_step.set())

    async def cancel(self, why: str) -> None:
        """Stop it; once this returns, no write of its split is under way (one that had
        begun is waited for, so a rollback written after it is the last word)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self._end(RolloutState.STOPPED, why)
        writing = self.writing
        if writing is not None and not writing.done():
            await asyncio.wait([writing])

    async def _run(self) -> None:
        base, new = self.baseline.version.version, self.candidate.version.version
        watched = (self.baseline.protection.outcomes, self.candidate.protection.outcomes)
        for outcomes in watched:  # kept while the judge reads them
            outcomes.watch()
        try:
            await self._steps(base, new)
        finally:
            for outcomes in watched:
                outcomes.unwatch()

    async def _steps(self, base: str, new: str) -> None:
        breaker = self.candidate.protection.breaker
        opened = breaker.opened  # the times it opened before this canary
        try:
            for percent in self.config.steps_percent:
                if not await self.set_traffic(canary_traffic(base, new, percent), new):
                    self._end(RolloutState.STOPPED, "the routing was changed")
                    return
                self.status.percent = percent
                self.first_step.set()
                if percent >= 100:
                    break
                started = self.clock.now()
                while True:
                    await self.clock.sleep(JUDGE_INTERVAL_S)
                    now = self.clock.now()
                    judgement = judge_canary(
                        self.config,
                        self.baseline.protection.outcomes.summary(started),
                        self.candidate.protection.outcomes.summary(started),
                        started,
                        now,
                        breaker_opened=breaker.opened - opened,
                    )
                    if judgement.verdict is Verdict.ROLL_BACK:
                        if not await self.set_traffic({base: 100}, new):
                            self._end(RolloutState.STOPPED, "the routing was changed")
                            return
                        log.warning("canary %s of %s rolled back: %s", new, base, judgement.reason)
                        self._end(RolloutState.ROLLED_BACK, judgement.reason, percent=0)
                        return
                    if judgement.verdict is Verdict.ADVANCE:
                        break
            self.status.state = RolloutState.DONE
            self.status.finished_unix_s = _unix()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a store failure: leave the split as it is, say so
            log.exception("canary %s of %s failed", new, base)
            self._end(RolloutState.FAILED, f"{type(exc).__name__}: {exc}")

    def _end(self, state: RolloutState, reason: str, percent: int | None = None) -> None:
        self.status.state, self.status.reason = state, reason
        if percent is not None:
            self.status.percent = percent


def _unix() -> float:
    return round(time.time(), 3)
