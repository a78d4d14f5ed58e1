"""What the scheduler's parts report, and the observer that turns it into telemetry.

The batcher and the instance pool never touch metrics or spans: they report
events to an :class:`Events` observer. :class:`TelemetryEvents` makes the
Prometheus series and the queue/load/batch spans of them; :class:`NoEvents`
drops them (tests, and nodes built without telemetry).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from enum import StrEnum
from itertools import repeat
from operator import attrgetter
from typing import Any

from fnrt.functions.version import VersionManifest
from fnrt.loader.instance import Runnable
from fnrt.runtime.queue import Call, Priority
from fnrt.runtime.stream import Usage
from fnrt.tracing.recorder import SpanContext, set_queued
from fnrt.tracing.telemetry import Telemetry

#: The name of each priority, as its queue span shows it.
_PRIORITY = {p: p.name.lower() for p in Priority}


def _waited(
    batch: Sequence[Call], started_ns: int, load: tuple[int, int, Mapping[str, Any]] | None
) -> list[SpanContext]:
    """Keep the queue wait of each request of ``batch``, which ``started_ns`` began
    serving, and the load it waited for, on its server span when that is recorded
    (a :class:`fnrt.tracing.recorder.ServerSpan`: its ``queued``, its children);
    the contexts of those spans, which the batch's span links to. When every request
    of the batch is recorded (tracing at 100%), with no Python frame a request; a
    batch of one or two (one connection) takes a plain loop, which costs it less."""
    if len(batch) <= 2:
        links = []
        for waiting in batch:
            span = waiting.span
            if span is not None and span.recording:
                span.queued = (waiting.enqueued_ns, started_ns, _PRIORITY[waiting.priority])
                if waiting.cold and load is not None:
                    span.after("load", *load)
                links.append(span.context)
        return links
    spans = list(map(_SPAN, batch))
    if None in spans or not all(map(_RECORDING, spans)):  # some are not recorded
        batch = [waiting for waiting in batch if waiting.span is not None]
        batch = [waiting for waiting in batch if waiting.span.recording]
        spans = list(map(_SPAN, batch))
    set_queued(
        spans,
        zip(
            map(_ENQUEUED_NS, batch),
            repeat(started_ns),
            map(_PRIORITY.__getitem__, map(_PRIORITY_OF, batch)),
        ),
    )
    if load is not None and any(map(_COLD, batch)):
        for waiting in batch:
            if waiting.cold:
                waiting.span.after("load", *load)
    return list(map(_CONTEXT, spans))


_SPAN = attrgetter("span")
_RECORDING = attrgetter("recording")
_ENQUEUED_NS = attrgetter("enqueued_ns")
_PRIORITY_OF = attrgetter("priority")
_COLD = attrgetter("cold")
_CONTEXT = attrgetter("context")


class StartKind(StrEnum):
    """What a call found when it arrived."""

    WARM = "warm"  # an instance loaded by an earlier call
    PREWARMED = "prewarmed"  # an instance loaded ahead of it by the keeper
    COLD = "cold"  # no instance: it waits for a load


class PrewarmOutcome(StrEnum):
    HIT = "hit"  # a call used the pre-warmed instance
    MISS = "miss"  # it was unloaded unused


class Events:
    """What the batcher and the instance pool tell the world; this base drops every
    event (:class:`NoEvents`), an observer overrides those it keeps."""

    def started(self, name: str, kind: StartKind) -> None:
        pass

    def prewarmed(self, name: str, outcome: PrewarmOutcome) -> None:
        pass

    def loaded(
        self, vm: VersionManifest, instance: Runnable, started_ns: int, ended_ns: int
    ) -> None:
        pass

    def first_batch(self, vm: VersionManifest, instance: Runnable) -> None:
        """A new instance ran its first batch (its ``timings_s``' ``first_batch_s``)."""

    def lost(self, vm: VersionManifest, cause: str) -> None:
        pass

    def deleted(self, name: str) -> None:
        """Function ``name`` was deleted, its versions closed: what is kept of it goes."""

    @property
    def traced(self) -> bool:
        """Whether batches may be traced (a batch sent ahead then records its handler's
        spans, to go under its span when it runs)."""
        return False

    def batch_started(self, vm: VersionManifest, batch: Sequence[Call], started_ns: int) -> Any:
        """The batch's span, open while it runs (None when not traced)."""
        return None

    def batch(
        self,
        vm: VersionManifest,
        batch: Sequence[Call],
        waits_s: Sequence[float],
        started_ns: int,
        elapsed_s: float,
        failure: BaseException | None,
        span: Any = None,
        handler_spans: Sequence[Mapping[str, Any]] = (),
        rows: int | None = None,
        ended_ns: int = 0,
    ) -> None:
        """A batch ended (at ``ended_ns``, ``time_ns``'s, when it is reported later: 0, now;
        ``waits_s``: each request's time in the queue; ``rows``: the
        handler's requests in it, when blocks of job records made it more than
        ``len(batch)``)."""

    def waiting(self) -> None:
        """A batch was handed to a worker process: the event loop waits for it now, and
        what it does meanwhile delays no request (the reports owed are made)."""

    def step_started(self, vm: VersionManifest, joining: Sequence[Call], started_ns: int) -> None:
        """A generative function's step starts; ``joining`` sequences join it."""

    def step(
        self,
        vm: VersionManifest,
        size: int,
        joined: int,
        elapsed_s: float,
        failure: BaseException | None,
        tokens: int = 0,
    ) -> None:
        """A step over ``size`` sequences (``joined`` of them new) made ``tokens`` chunks."""

    def sequence_ended(self, vm: VersionManifest, waiting: Call, reason: str, usage: Usage) -> None:
        """A generate request ended (``reason``) with ``usage``."""


class NoEvents(Events):
    """An observer that drops every event."""


class TelemetryEvents(Events):
    """Metrics and (tracing on) spans of the scheduler's events."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        # The last load of each version: cold requests' "load" spans point at it.
        self._loads: dict[tuple[str, str], tuple[int, int, dict[str, Any]]] = {}

    def started(self, name: str, kind: StartKind) -> None:
        self.telemetry.metrics.start(name, kind)  # a StrEnum is its value

    def prewarmed(self, name: str, outcome: PrewarmOutcome) -> None:
        self.telemetry.metrics.prewarm(name, outcome)

    def loaded(
        self, vm: VersionManifest, instance: Runnable, started_ns: int, ended_ns: int
    ) -> None:
        total_s = instance.timings_s["total_s"]
        self.telemetry.metrics.load(vm.name, instance.tier, instance.size_bytes, total_s)
        stages = self.telemetry.metrics.load_stage_seconds
        for stage, seconds in instance.timings_s.items():
            if stage != "total_s":
                stages.labels(stage.removesuffix("_s")).observe(seconds)
        self._loads[(vm.name, vm.version)] = (
            started_ns,
            ended_ns,
            {
                "fnrt.load.tier": instance.tier,
                "fnrt.load.bytes": instance.size_bytes,
                **{f"fnrt.load.{k}": v for k, v in instance.timings_s.items()},
            },
        )

    def first_batch(self, vm: VersionManifest, instance: Runnable) -> None:
        seconds = instance.timings_s["first_batch_s"]
        self.telemetry.metrics.load_stage_seconds.labels("first_batch").observe(seconds)
        load = self._loads.get((vm.name, vm.version))
        if load is not None:  # its load span, when not exported yet, shows it too
            load[2]["fnrt.load.first_batch_s"] = seconds
            load[2]["fnrt.load.total_s"] = instance.timings_s["total_s"]

    def lost(self, vm: VersionManifest, cause: str) -> None:
        self.telemetry.metrics.restart(vm.name, cause)

    def deleted(self, name: str) -> None:
        self.telemetry.settle()  # its last reports, or they would bring its series back
        self.telemetry.metrics.forget(name)
        for key in [key for key in self._loads if key[0] == name]:
            del self._loads[key]

    @property
    def traced(self) -> bool:
        return self.telemetry.tracing.enabled

    def batch_started(self, vm: VersionManifest, batch: Sequence[Call], started_ns: int) -> Any:
        tracing = self.telemetry.tracing
        if not tracing.enabled:
            return None
        links = _waited(batch, started_ns, self._loads.get((vm.name, vm.version)))
        return tracing.batch_span(vm.name, vm.version, links, started_ns)

    def batch(
        self,
        vm: VersionManifest,
        batch: Sequence[Call],
        waits_s: Sequence[float],
        started_ns: int,
        elapsed_s: float,
        failure: BaseException | None,
        span: Any = None,
        handler_spans: Sequence[Mapping[str, Any]] = (),
        rows: int | None = None,
        ended_ns: int = 0,
    ) -> None:
        size = len(batch) if rows is None else rows
        warm = sum(1 for p in batch if not p.cold)
        self.telemetry.batch(
            vm.name, size, elapsed_s, waits_s, warm, span, failure, handler_spans, ended_ns
        )

    def waiting(self) -> None:
        self.telemetry.settle_soon()

    def step_started(self, vm: VersionManifest, joining: Sequence[Call], started_ns: int) -> None:
        tracing = self.telemetry.tracing
        if not tracing.enabled:
            return
        _waited(joining, started_ns, self._loads.get((vm.name, vm.version)))

    def step(
        self,
        vm: VersionManifest,
        size: int,
        joined: int,
        elapsed_s: float,
        failure: BaseException | None,
        tokens: int = 0,
    ) -> None:
        self.telemetry.metrics.step(vm.name, size, elapsed_s, tokens)

    def sequence_ended(self, vm: VersionManifest, waiting: Call, reason: str, usage: Usage) -> None:
        tokens = usage.completion_tokens
        self.telemetry.metrics.sequence(
            vm.name,
            reason,
            usage.time_to_first_token_s if tokens else None,
            usage.time_per_output_token_s if tokens > 1 else None,
        )
        span = waiting.span
        if span is None or not self.telemetry.tracing.enabled:
            return
        ended_ns = time.time_ns()  # the sequence's time from its first chunk to its end
        first_ns = ended_ns - int((usage.total_s - usage.time_to_first_token_s) * 1e9)
        attributes = {
            "fnrt.finish_reason": reason,
            "fnrt.tokens.prompt": usage.prompt_tokens,
            "fnrt.tokens.completion": tokens,
            "fnrt.time_to_first_token_ms": round(usage.time_to_first_token_s * 1000, 3),
        }
        self.telemetry.tracing.after(span, "generate", first_ns, ended_ns, attributes)
