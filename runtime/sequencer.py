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
from dataclasses import dataclass, field
from typing import Any

from fnrt.functions.errors import DeadlineExceeded, FnrtError
from fnrt.functions.generation import (
    CANCELLED,
    DEADLINE,
    Joining,
    StepBatch,
    Stepped,
    check_prompt,
    parse_parameters,
    prompt_tokens,
)
from fnrt.functions.manifest import GenerationConfig
from fnrt.functions.version import VersionManifest
from fnrt.loader.instance import Runnable
from fnrt.runtime.clock import Clock
from fnrt.runtime.events import Events, StartKind
from fnrt.runtime.intake import Admission, Intake
from fnrt.runtime.pool import InstancePool, Slot, run_failure
from fnrt.runtime.protection import Protection, Served
from fnrt.runtime.queue import Call
from fnrt.runtime.stats import Stats, Window
from fnrt.runtime.stream import Stream, Usage

log = logging.getLogger("fnrt.sequencer")


@dataclass(eq=False)
class Running:
    """A sequence in an instance's batch."""

    id: int
    waiting: Call
    stream: Stream
    joined: float  # clock time it joined a step
    first: float | None = None  # clock time of its first chunk
    generated: int = 0
    tokens: int = 0

    def joining(self) -> Joining:
        """What the instance is told of it at the step it joins."""
        w = self.waiting
        return Joining(self.id, w.inputs, w.asked.parameters, w.asked.max_new_tokens)

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


class Sequencer(Intake):
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
        self._config: GenerationConfig = version.manifest.generation
        self.deep_rows = self._config.max_active  # a deep queue: a step's worth waits
        self._next_id = 0
        self._running: dict[int, list[Running]] = {}  # per slot index
        self.generation = GenerationStats()
        super().__init__(version, pool, clock, stats, events, admission, protection)

    @property
    def active(self) -> int:
        """Sequences in a step batch now, on every instance."""
        return sum(len(r) for r in self._running.values())

    @property
    def outstanding(self) -> int:
        """Waiting and running sequences: while any, the version is not idle."""
        return len(self._queue) + self.active

    # --- admission ---------------------------------------------------------------------

    def submit(self, call: Call) -> asyncio.Future[Served]:
        """Admit one sequence (raising at once if it may not join: VersionRetired,
        Overloaded, InvalidInput for a prompt past the limits) and queue it; its future
        is answered at once with what carries its stream. Its chunks, or its error,
        come through the stream."""
        manifest = self._manifest
        config = self._config
        if call.asked is None:  # no parameters asked for (a job's record): the defaults
            call.asked = parse_parameters(config, None)
        tokens = prompt_tokens(config, call.inputs, manifest.prompt_input)
        check_prompt(config, tokens, call.asked.max_new_tokens, manifest.prompt_input)
        self._admission.check(self)
        call.cold = self._pool.starts.count(call.enqueued_at) is StartKind.COLD
        call.prompt_tokens = tokens
        call.stream = stream = Stream(tokens)
        self.generation.sequences += 1
        self._push(call)
        answer: asyncio.Future[Served] = asyncio.get_running_loop().create_future()
        answer.set_result(Served({}, stream=stream))  # its future marks it answered in the queue
        return answer

    def retry_after_s(self) -> float:
        per_step = self.cost.predict(self._config.max_active) if self.cost.fitted else 0.05
        steps = self._config.max_new_tokens * max(len(self._queue), 1) / self._config.max_active
        return float(min(max(round(steps * per_step), 1), 60))

    # --- the loop ----------------------------------------------------------------------

    def _serve(self, slot: Slot) -> None:
        self._running[slot.index] = []
        self._start(self._work(slot))

    def fail_queued(self, error: BaseException) -> None:
        """Answer every queued sequence with ``error`` now, and end the running ones (a
        shutdown cutting them off)."""
        super().fail_queued(error)
        running = [r.waiting for rs in self._running.values() for r in rs]
        self._settle_failed(running, error, self._clock.now())

    def _answer_error(self, call: Call, error: BaseException) -> bool:
        stream = call.stream
        if stream is None or stream.done:
            return False
        stream.fail(error)  # the gateway got its stream at submit: the error goes there
        if not call.future.done():  # the queue's mark that it is answered
            call.future.set_result({})
        return True

    async def _work(self, slot: Slot) -> None:
        pool = self._pool
        running = self._running[slot.index]
        leaving: list[int] = []  # ended here; the instance lets them go at its next step
        instance: Runnable | None = None
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
                    instance = None  # idle: an instance unloaded meanwhile is freed at once
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                try:
                    instance = await pool.ensure(slot)
                except FnrtError as exc:
                    if running:  # their state was on the instance that is gone: they end
                        self._settle_failed([r.waiting for r in running], exc, self._clock.now())
                        running.clear()
                    if slot.primary:
                        if pool.instances == 0:  # nobody else can serve them
                            self.fail_queued(exc)
                        elif self.closing:  # the others serve the queue (Intake.close)
                            return
                        else:
                            self._wake.clear()
                            await self._wake.wait()
                        continue
                    return  # the pool gave the extra slot up (InstancePool._load)
                now = self._clock.now()
                leaving += self._end_dropped(running, now)
                joining = self._join(running, now)
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

    def _join(self, running: list[Running], now: float) -> list[Running]:
        """Waiting sequences that join at this step: while there is room in ``max_active``
        and the token budget (one always joins an empty batch)."""
        config = self._config
        room = config.max_active - len(running)
        used = sum(r.tokens for r in running)
        joining: list[Running] = []
        while room > 0 and self._queue:
            taken = self._take(1, now)
            if not taken.batch:
                continue
            waiting = taken.batch[0]
            assert waiting.stream is not None
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
            self._settle_failed([r.waiting for r in everyone], error, self._clock.now())
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
        protection = self._protection
        if r.waiting.counted and protection is not None:  # for the breaker and a canary
            if reason == DEADLINE:  # a failure of the version's, as a batch request's is
                why = f"function '{self.name}': the deadline passed mid-sequence"
                protection.failed(now, usage.total_s, DeadlineExceeded(why), r.waiting.inputs)
            elif reason != CANCELLED:  # a client that left says nothing of the version
                protection.succeeded(now, usage.total_s)
        self._events.sequence_ended(self.version, r.waiting, reason, usage)

    def describe(self) -> dict[str, Any]:
        config = self._config
        return {
            "max_active": config.max_active,
            "token_budget": config.token_budget,
            "tokens_in_use": sum(r.tokens for rs in self._running.values() for r in rs),
            **self.generation.describe(self.active),
        }
