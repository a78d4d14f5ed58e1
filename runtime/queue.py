"""The admission queue of one function: three priority classes, deadlines, aging,
and a fourth class below them for job records.

High-priority requests are taken first and never wait behind a backlog of
lower ones; a request that has waited ``aging_s`` counts as one class higher
(two classes after twice that), so low ones are never starved. Job records
(``Priority.JOB``, asynchronous jobs: ``runtime/jobs/``) never age: they take
only what the live classes leave of a batch. Within a class requests leave in
arrival order. Taking a batch is a pure function of the
queue and ``now``; the scheduler owns the asyncio side.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol

import numpy as np

from fnrt.functions.handler import Request
from fnrt.runtime.result_cache import inputs_key

Outputs = dict[str, np.ndarray[Any, Any]]


class Priority(IntEnum):
    """Lower value, served first."""

    HIGH = 0
    NORMAL = 1
    LOW = 2
    JOB = 3  # a job's records: idle capacity only, never aged (not a client's to ask for)

    @staticmethod
    def parse(text: str) -> Priority:
        """A client's priority: high, normal or low."""
        key = text.strip().upper()
        if key not in ("HIGH", "NORMAL", "LOW"):
            raise ValueError(f"priority {text!r} is not high, normal or low")
        return Priority[key]


class Client(Protocol):
    """A request's connection, as the queue sees it: whether it has gone."""

    disconnected: bool


@dataclass(eq=False, slots=True)
class Call:
    """One request, from where its body is decoded to its answer: the queue entry itself.

    Built once (``Gateway.call``), for the version already chosen to answer it, with
    its inputs checked against that version; the guards read it, the queue holds it,
    the batch answers its ``future`` with a :class:`~fnrt.runtime.protection.Served`.
    Only the queue's own marks (``cold``, ``started``) and a sequence's (``stream``,
    ``prompt_tokens``) change after that. Slotted, not frozen: a frozen dataclass
    takes four times as long to build, and every request builds one.
    """

    inputs: Request
    future: asyncio.Future[Any]  # a Served (a block of job records: a list of Outputs)
    enqueued_at: float  # clock time it arrived (its deadline and latency count from here)
    priority: Priority = Priority.NORMAL
    deadline: float | None = None  # clock time after which it is not worth computing
    cold: bool = False  # no instance was loaded when it was admitted
    started: bool = False  # taken into a batch
    span: Any = None  # the request's server span, when tracing is on
    enqueued_ns: int = 0  # wall-clock arrival for its queue span (tracing on)
    client: Client | None = None  # its connection, when the server tells if it left
    alone: bool = False  # runs in a batch of its own (a job record tried again)
    block: list[Request] | None = None  # a block of job records, answered as one list
    rows: int = 1  # the handler's requests it stands for (a block's length)
    scheduler: Any = None  # the version's parts (``Scheduler``) chosen for it
    counted: bool = False  # its outcome counts for the version's breaker and canary
    split: int | None = None  # a split tail's k
    asked: Any = None  # a generate request's checked parameters (``Asked``)
    stream: Any = None  # a sequence's chunks (``Stream``), made when it is admitted
    prompt_tokens: int = 0  # a sequence's prompt, counted when it is admitted
    answered_by: Any = None  # the scheduler that answered instead (a breaker's fallback)
    _key: str | None = None  # the digest of its inputs, once a guard asked

    @property
    def tokens(self) -> int:
        """What a sequence holds of the token budget while it runs."""
        return self.prompt_tokens + int(self.asked.max_new_tokens)

    @property
    def key(self) -> str:
        """The digest of the inputs (computed once: the result cache's key)."""
        if self._key is None:
            self._key = inputs_key(self.inputs)
        return self._key


@dataclass(frozen=True)
class Taken:
    """What :meth:`RequestQueue.take` removed: a batch to run and requests past their deadline."""

    batch: list[Call]
    expired: list[Call]
    removed: int  # everything popped: the batch, the expired, and requests already answered
    abandoned: list[Call]  # their clients disconnected while they waited
    rows: int = 0  # the handler's requests in the batch (a block counts its records)
    blocks: bool = False  # the batch holds a block of job records


class RequestQueue:
    """FIFO per priority class, with aging across classes."""

    def __init__(self, aging_s: float) -> None:
        self.aging_s = aging_s
        self._classes: tuple[deque[Call], ...] = tuple(deque() for _ in Priority)
        self._size = 0
        self._rows = 0  # the handler's requests queued: a block counts its records

    def __len__(self) -> int:
        return self._size

    @property
    def rows(self) -> int:
        """The handler's requests queued (a block of job records counts each record)."""
        return self._rows

    def push(self, pending: Call) -> None:
        self._classes[pending.priority].append(pending)
        self._size += 1
        self._rows += pending.rows

    def put_back(self, pending: Call) -> None:
        """Return a request just taken to the head of its class (it did not fit)."""
        self._classes[pending.priority].appendleft(pending)
        self._size += 1
        self._rows += pending.rows

    def live(self) -> int:
        """Requests queued in the live classes (every one but job records)."""
        return self._size - len(self._classes[Priority.JOB])

    def oldest_enqueued_at(self) -> float | None:
        heads = [q[0].enqueued_at for q in self._classes if q]
        return min(heads) if heads else None

    def depth_by_priority(self) -> dict[str, int]:
        return {p.name.lower(): len(self._classes[p]) for p in Priority}

    def _effective(self, pending: Call, now: float) -> tuple[int, float]:
        if pending.priority is Priority.JOB:
            return Priority.JOB, pending.enqueued_at
        promoted = int((now - pending.enqueued_at) / self.aging_s) if self.aging_s > 0 else 0
        return max(int(pending.priority) - promoted, 0), pending.enqueued_at

    def _pop_next(self, now: float) -> Call | None:
        best: deque[Call] | None = None
        best_key: tuple[int, float] | None = None
        for q in self._classes:
            if q:
                key = self._effective(q[0], now)
                if best_key is None or key < best_key:
                    best, best_key = q, key
        if best is None:
            return None
        self._size -= 1
        pending = best.popleft()
        self._rows -= pending.rows
        return pending

    def take(self, max_size: int, now: float) -> Taken:
        """Up to ``max_size`` live requests in service order; dead ones are dropped.

        A request already answered (its future is done) is discarded; one whose
        deadline has passed is returned in ``expired`` for a 504, and one whose
        client disconnected in ``abandoned``. A block of job records counts its
        records and joins only a batch it fits in whole (or an empty one); a
        request ``alone`` gets a batch of its own.
        """
        batch: list[Call] = []
        expired: list[Call] = []
        abandoned: list[Call] = []
        removed = 0
        size = 0
        blocks = False
        # With one class queued (the usual case) aging cannot reorder anything:
        # take from it in arrival order without comparing the classes' heads.
        queued = [q for q in self._classes if q]
        only = queued[0] if len(queued) == 1 else None
        while size < max_size:
            if only is None:
                pending = self._pop_next(now)
                if pending is None:
                    break
            elif only:
                pending = only.popleft()
                self._size -= 1
                self._rows -= pending.rows
            else:
                break
            removed += 1
            if pending.future.done():
                continue
            if pending.deadline is not None and now >= pending.deadline:
                expired.append(pending)
                continue
            client = pending.client
            if client is not None and client.disconnected:
                abandoned.append(pending)
                continue
            rows = pending.rows
            if batch and (pending.alone or size + rows > max_size):
                self.put_back(pending)  # the next batch takes it
                removed -= 1
                break
            pending.started = True
            batch.append(pending)
            size += rows
            if pending.block is not None:
                blocks = True
            if pending.alone:
                break
        return Taken(batch, expired, removed, abandoned, size, blocks)

    def earliest_deadline(self, size: int) -> float | None:
        """The soonest deadline among the first ``size`` requests of each class (what a
        take of ``size`` rows may remove); None when none of them has one."""
        soonest: float | None = None
        for q in self._classes:
            for call in itertools.islice(q, size):
                deadline = call.deadline
                if deadline is not None and (soonest is None or deadline < soonest):
                    soonest = deadline
        return soonest

    def due(self, now: float) -> tuple[list[Call], float | None]:
        """Queued calls past their deadline and not answered yet (they stay queued: a
        take drops them), and the earliest deadline still ahead (None: none)."""
        due: list[Call] = []
        ahead: float | None = None
        for q in self._classes:
            for call in q:
                deadline = call.deadline
                if deadline is None or call.future.done():
                    continue
                if now >= deadline:
                    due.append(call)
                elif ahead is None or deadline < ahead:
                    ahead = deadline
        return due, ahead

    def drain(self) -> list[Call]:
        """Remove and return everything queued."""
        out = [p for q in self._classes for p in q]
        for q in self._classes:
            q.clear()
        self._size = self._rows = 0
        return out
