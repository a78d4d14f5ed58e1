"""The continuous batcher of a generative function version (docs/generation.md).

A request to a generative function is a *sequence*: it is answered over many
steps, one chunk per step. Requests wait in the same bounded priority queue
as any function's (:class:`~fnrt.runtime.queue.RequestQueue`: 429 past
``max_queue``, deadlines, aging). Each slot of the
:class:`~fnrt.runtime.pool.InstancePool` has a loop here that runs its
instance's steps; between two steps it

1. ends the sequences whose client left (``cancelled``) or whose deadline
   passed (``deadline``): they leave at this step;
2. admits waiting requests while fewer than ``max_active`` run and their
   tokens (prompt + ``max_new_tokens``) fit in ``token_budget``;
3. runs one step: the handler's ``start`` for the joining sequences and
   ``step`` for the others (``loader/stepper.py``), and pushes each chunk to
   its sequence's :class:`~fnrt.runtime.stream.Stream`.

So sequences join a running batch between steps and leave it as they
finish, instead of a batch waiting for its longest member (Orca's
iteration-level scheduling). A step that fails fails the sequences in it;
the others wait in the queue for the next step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fnrt.functions.errors import (
    ClientLeft,
    DeadlineExceeded,
    FnrtError,
)
from fnrt.functions.generation import CANCELLED, DEADLINE, Joining, StepBatch, Stepped
from fnrt.functions.handler import Request
from fnrt.functions.manifest import GenerationConfig
from fnrt.functions.version import VersionManifest
from fnrt.runtime.batcher import Admission
from fnrt.runtime.batching import CostModel, RateEstimator
from fnrt.runtime.clock import Clock
from fnrt.runtime.events import Events
from fnrt.runtime.pool import InstancePool, Slot, run_failure
from fnrt.runtime.protection import Protection, Served
from fnrt.runtime.queue import Client, Outputs, Pending, Priority, RequestQueue
from fnrt.runtime.stats import Stats, Window
from fnrt.runtime.stream import Stream, Usage

log = logging.getLogger("fnrt.sequencer")


@dataclass(eq=False)
class Waiting(Pending):
    """A queued sequence: a request with its stream and what it asked for. Its future
    is set when it leaves the queue some other way than by joining (cancelled)."""

    stream: Stream | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    max_new_tokens: int = 1
    prompt_tokens: int = 0

    @property
    def tokens(self) -> int:
        """What it holds of the token budget while it runs."""
        return self.prompt_tokens + self.max_new_tokens


@dataclass(eq=False)
class Running:
    """A sequence in an instance's batch."""

    id: int
    waiting: Waiting
    stream: Stream
    joined: float  # clock time it joined a step
    first: float | None = None  # clock time of its first chunk
    generated: int = 0
    tokens: int = 0

    def joining(self) -> Joining:
        """What the instance is told of it at the step it joins."""
        w = self.waiting
        return Joining(self.id, w.inputs, w.parameters, w.max_new_tokens)

    def usage(self, now: float) -> Usage:
        arrived = self.waiting.enqueued_at
        first = self.first if self.first is not None else now
        return Usage(
            self.waiting.prompt_tokens,
            self.generated,
            self.joined - arrived,
            first - arrived,
            now - arrived,
        )


@dataclass
class GenerationStats:
    """What the sequencer saw (``describe``)."""

    sequences: int = 0
    tokens: int = 0
    steps: int = 0
    ended: dict[str, int] = field(default_factory=dict)
    time_to_first_token: Window = field(default_factory=Window)
    time_per_output_token: Window = field(default_factory=Window)
    step_sizes: Window = field(default_factory=Window)  # sequences per step (not seconds)

    def describe(self, active: int) -> dict[str, Any]:
        sizes = self.step_sizes.summary()
        return {
            "active_sequences": active,
            "sequences": self.sequences,
            "tokens": self.tokens,
            "steps": self.steps,
            "ended": dict(self.ended),
            "time_to_first_token": self.time_to_first_token.summary(),
            "time_per_output_token": self.time_per_output_token.summary(),
            # a Window speaks milliseconds: sizes were added as thousandths
            "step_size": {
                "count": sizes["count"],
                **{
                    k.removesuffix("_ms"): v
                    for k, v in sizes.items()
                    if k in ("mean_ms", "p50_ms", "p99_ms")
                },
            },
        }


class Sequencer:
    """Queue and step loop of one generative function version."""

    def __init__(
        self,
        version: VersionManifest,
        pool: InstancePool,
        clock: Clock,
        stats: Stats,
        events: Events,
        admission: Admission | None = None,
        protection: Protection | None = None,
    ) -> None:
        assert version.manifest.generation is not None
        self._protection = protection  # a sequence's outcome counts when it ends
        self.version = version
        self._manifest = version.manifest
        self._config: GenerationConfig = version.manifest.generation
        self._pool = pool
        self._clock = clock
        self._stats = stats
        self._events = events
        self._admission = admission or Admission(1 << 62)
        requests = self._manifest.requests
        self.default_priority = Priority.parse(requests.default_priority)
        self._queue = RequestQueue(requests.aging_ms / 1000.0)
        self._wake = asyncio.Event()
        self._next_id = 0
        self._running: dict[int, list[Running]] = {}  # per slot index
        self._timers: set[asyncio.Future[None]] = set()  # queued sequences' deadlines
        self.closing = False
        self.cost = CostModel()  # per step
        self.arrivals = RateEstimator()
        self.generation = GenerationStats()
        pool.changed = self._wake.set
        self._serve(pool.add_slot())

    @property
    def name(self) -> str:
        return self._manifest.name

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def active(self) -> int:
        """Sequences in a step batch now, on every instance."""
        return sum(len(r) for r in self._running.values())

    @property
    def outstanding(self) -> int:
        """Waiting and running sequences: while any, the version is not idle."""
        return len(self._queue) + self.active

    def depth_by_priority(self) -> dict[str, int]:
        return self._queue.depth_by_priority()

    # --- admission ---------------------------------------------------------------------

    def admit(self, now: float, timeout_s: float | None) -> None:
        """Raise unless a request may join the queue now: VersionRetired (closing),
        Overloaded (a queue bound)."""
        self._admission.check(
            self.version, self.closing, len(self._queue), self._stats, self._retry_after_s
        )

    def _retry_after_s(self) -> float:
        per_step = self.cost.predict(self._config.max_active) if self.cost.fitted else 0.05
        steps = self._config.max_new_tokens * max(len(self._queue), 1) / self._config.max_active
        return float(min(max(round(steps * per_step), 1), 60))

    async def enqueue(
        self,
        inputs: Request,
        now: float,
        *,
        priority: Priority | None = None,
        timeout_s: float | None = None,
        span: Any = None,
        cold: bool = False,
        client: Client | None = None,
        parameters: Mapping[str, Any] | None = None,
        max_new_tokens: int | None = None,
        prompt_tokens: int = 0,
    ) -> Served:
        """Queue one sequence admitted at ``now`` (:meth:`admit`); at once, what
        carries its stream. Its chunks, or its error, come through the stream."""
        self._stats.requests += 1
        self.generation.sequences += 1
        self.arrivals.arrive(now)
        if timeout_s is None and self._manifest.requests.timeout_ms > 0:
            timeout_s = self._manifest.requests.timeout_ms / 1000.0
        deadline = now + timeout_s if timeout_s is not None else None
        chosen = self.default_priority if priority is None else priority
        stream = Stream(prompt_tokens)
        future: asyncio.Future[Outputs] = asyncio.get_running_loop().create_future()
        waiting = Waiting(inputs, future, now, chosen, deadline, cold)
        waiting.client = client
        waiting.stream = stream
        waiting.parameters = parameters or {}
        waiting.max_new_tokens = max_new_tokens or self._config.max_new_tokens
        waiting.prompt_tokens = prompt_tokens
        if span is not None:
            waiting.span, waiting.enqueued_ns = span, time.time_ns()
        self._queue.push(waiting)
        self._admission.queued += 1
        self._wake.set()
        if deadline is not None:  # expire it while it waits, even if no step comes by
            timer = asyncio.ensure_future(self._expire_later(waiting, deadline - now))
            self._timers.add(timer)
            timer.add_done_callback(self._timers.discard)
        return Served({}, stream=stream)

    async def _expire_later(self, waiting: Waiting, delay_s: float) -> None:
        await self._clock.sleep(delay_s)
        if not waiting.started and not waiting.future.done():
            self._expire(waiting, self._clock.now())  # the queue drops it when it comes up

    # --- the loop ----------------------------------------------------------------------

    def _serve(self, slot: Slot) -> None:
        self._running[slot.index] = []
        slot.worker = asyncio.ensure_future(self._work(slot))

    def wake(self) -> None:
        self._wake.set()

    async def close(self) -> None:
        """Stop taking requests; return when the queued and running sequences are done
        (sequences running on a version being replaced finish there)."""
        self.closing = True
        self._wake.set()
        workers = [s.worker for s in self._pool.slots if s.worker is not None]
        await asyncio.gather(*(asyncio.shield(w) for w in workers), return_exceptions=True)

    def fail_queued(self, error: FnrtError) -> None:
        """Answer every queued sequence with ``error`` now, and end the running ones (a
        shutdown cutting them off)."""
        for waiting in self._queue.drain():
            self._admission.queued -= 1
            assert isinstance(waiting, Waiting)
            self._fail(waiting, error)
        for running in self._running.values():
            for r in running:
                self._fail(r.waiting, error)

    def _fail(self, waiting: Waiting, error: FnrtError) -> None:
        assert waiting.stream is not None
        if not waiting.stream.done:
            self._stats.errors += 1
            waiting.stream.fail(error)
            now = self._clock.now()
            self._stats.totals.fail.add(now - waiting.enqueued_at)
            if self._protection is not None:
                self._protection.failed(now, now - waiting.enqueued_at, error, waiting.inputs)
        if not waiting.future.done():
            waiting.future.set_result({})

    def _maybe_scale_up(self, now: float) -> None:
        if self._pool.wants_another(len(self._queue), now, self._config.max_active):
            slot = self._pool.add_slot()
            log.info("scaling %s up to %d instances", self.name, len(self._pool.slots))
            self._pool.load_in_background(slot)
            self._serve(slot)

    async def _work(self, slot: Slot) -> None:
        pool = self._pool
        running = self._running[slot.index]
        leaving: list[int] = []  # ended here; the instance lets them go at its next step
        try:
            while not slot.retired:
                self._maybe_scale_up(self._clock.now())
                if not running and not self._queue:
                    if leaving and slot.instance is not None:
                        await self._step(slot, slot.instance, running, [], leaving)
                        leaving = []
                        continue
                    if self.closing:
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                try:
                    instance = await pool.ensure(slot)
                except FnrtError as exc:
                    if slot.primary:
                        if pool.instances == 0:  # nobody else can serve them
                            self.fail_queued(exc)
                            running.clear()
                        else:
                            self._wake.clear()
                            await self._wake.wait()
                        continue
                    pool.retire(slot)
                    return
                now = self._clock.now()
                leaving += self._end_dropped(running, now)
                joining = self._take(running, now)
                if not running and not joining and not leaving:
                    if self._queue:  # nothing fits now (the budget): wait for a change
                        self._wake.clear()
                        await self._clock.wait(self._wake, 0.05)
                    continue
                for r in joining:
                    if r.waiting.cold:
                        r.stream.cold_tier = self._stats.last_load_tier
                await self._step(slot, instance, running, joining, leaving)
                leaving = []
        finally:
            self._running.pop(slot.index, None)

    def _end_dropped(self, running: list[Running], now: float) -> list[int]:
        """End the sequences whose client left or whose deadline passed; their ids."""
        ended = []
        for r in running:
            waiting = r.waiting
            client = waiting.client
            if r.stream.cancelled or (client is not None and client.disconnected):
                self._end(r, CANCELLED, now)
            elif waiting.deadline is not None and now >= waiting.deadline:
                self._end(r, DEADLINE, now)
            else:
                continue
            ended.append(r.id)
        if ended:
            running[:] = [r for r in running if not r.stream.done]
        return ended

    def _take(self, running: list[Running], now: float) -> list[Running]:
        """Waiting sequences that join at this step: while there is room in ``max_active``
        and the token budget (one always joins an empty batch)."""
        config = self._config
        room = config.max_active - len(running)
        used = sum(r.tokens for r in running)
        joining: list[Running] = []
        while room > 0 and self._queue:
            taken = self._queue.take(1, now)
            self._admission.queued -= taken.removed
            for pending in taken.expired:
                self._expire(pending, now)
            for pending in taken.abandoned:
                self._abandon(pending)
            if not taken.batch:
                continue
            waiting = taken.batch[0]
            assert isinstance(waiting, Waiting) and waiting.stream is not None
            if waiting.stream.cancelled:
                self._abandon(waiting)
                continue
            budget = config.token_budget
            if budget and used + waiting.tokens > budget and (running or joining):
                waiting.started = False
                self._queue.put_back(waiting)
                self._admission.queued += 1
                break
            self._next_id += 1
            joining.append(Running(self._next_id, waiting, waiting.stream, now))
            joining[-1].tokens = waiting.tokens
            used += waiting.tokens
            room -= 1
        return joining

    async def _step(
        self,
        slot: Slot,
        instance: Any,
        running: list[Running],
        joining: list[Running],
        leaving: list[int],
    ) -> None:
        started = self._clock.now()
        started_ns = time.time_ns()
        for r in joining:
            waiting = r.waiting
            self._stats.queue_wait.add(started - waiting.enqueued_at)
            self._stats.totals.queue.add(started - waiting.enqueued_at)
        batch = StepBatch([r.joining() for r in joining], leaving)
        everyone = running + joining
        self._events.step_started(self.version, [r.waiting for r in joining], started_ns)
        failure: BaseException | None = None
        stepped: Stepped | None = None
        try:
            stepped = await self._pool.step(slot, instance, batch)
        except Exception as exc:
            failure = exc
            error = run_failure(exc, self.version, f"a step of {len(everyone)} sequences")
            for r in everyone:
                self._fail(r.waiting, error)
            running.clear()
        else:
            self._deliver(everyone, stepped, self._clock.now())
            running[:] = [r for r in everyone if not r.stream.done]
        finally:
            elapsed = self._clock.now() - started
            size = len(everyone)
            if size:
                self.cost.observe(size, elapsed)
            stats = self.generation
            stats.steps += 1
            stats.step_sizes.add(size / 1000.0)
            self._stats.batches += 1
            self._stats.batch_sizes[size] += 1
            self._stats.compute.add(elapsed)
            tokens = len(stepped.ids) if stepped is not None else 0
            self._events.step(self.version, size, len(joining), elapsed, failure, tokens)

    def _deliver(self, everyone: list[Running], stepped: Stepped, now: float) -> None:
        by_id = {r.id: r for r in everyone}
        for id_, outputs, why in zip(stepped.ids, stepped.outputs, stepped.ended, strict=True):
            r = by_id.get(id_)
            if r is None or r.stream.done:
                continue
            if r.first is None:
                r.first = now
            r.generated += 1
            self.generation.tokens += 1
            r.stream.push(outputs)
            if why is not None:
                self._end(r, why, now)

    def _end(self, r: Running, reason: str, now: float) -> None:
        usage = r.usage(now)
        r.stream.end(reason, usage)
        if not r.waiting.future.done():
            r.waiting.future.set_result({})
        stats = self.generation
        stats.ended[reason] = stats.ended.get(reason, 0) + 1
        if r.first is not None:
            stats.time_to_first_token.add(usage.time_to_first_token_s)
        if usage.completion_tokens > 1:
            stats.time_per_output_token.add(usage.time_per_output_token_s)
        totals = self._stats.totals
        totals.success.add(usage.total_s)
        totals.last_request_unix_s = time.time()
        if self._protection is not None:
            self._protection.succeeded(now, usage.total_s)
        self._events.sequence_ended(self.version, r.waiting, reason, usage)

    def _expire(self, waiting: Pending, now: float) -> None:
        assert isinstance(waiting, Waiting)
        self._stats.expired += 1
        waited = now - waiting.enqueued_at
        self._fail(
            waiting,
            DeadlineExceeded(
                f"function '{self.name}': the deadline passed after "
                f"{waited * 1000:.0f} ms in the queue"
            ),
        )

    def _abandon(self, waiting: Pending) -> None:
        assert isinstance(waiting, Waiting)
        self._stats.abandoned += 1
        self._fail(
            waiting,
            ClientLeft(f"function '{self.name}': the client left while its request was queued"),
        )

    def describe(self) -> dict[str, Any]:
        config = self._config
        return {
            "max_active": config.max_active,
            "token_budget": config.token_budget,
            "tokens_in_use": sum(r.tokens for rs in self._running.values() for r in rs),
            **self.generation.describe(self.active),
        }
