"""The admission queue of one function: three priority classes, deadlines, aging.

High-priority requests are taken first and never wait behind a backlog of
lower ones; a request that has waited ``aging_s`` counts as one class higher
(two classes after twice that), so low ones are never starved. Within a class
requests leave in arrival order. Taking a batch is a pure function of the
queue and ``now``; the scheduler owns the asyncio side.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol

import numpy as np

from fnrt.functions.handler import Request

Outputs = dict[str, np.ndarray[Any, Any]]


class Priority(IntEnum):
    """Lower value, served first."""

    HIGH = 0
    NORMAL = 1
    LOW = 2

    @staticmethod
    def parse(text: str) -> Priority:
        try:
            return Priority[text.strip().upper()]
        except KeyError:
            raise ValueError(f"priority {text!r} is not high, normal or low") from None


class Client(Protocol):
    """A request's connection, as the queue sees it: whether it has gone."""

    disconnected: bool


@dataclass(eq=False)
class Pending:
    """One queued request."""

    inputs: Request
    future: asyncio.Future[Outputs]
    enqueued_at: float
    priority: Priority = Priority.NORMAL
    deadline: float | None = None  # clock time after which it is not worth computing
    cold: bool = False  # no instance was loaded when it arrived
    started: bool = field(default=False)  # taken into a batch
    span: Any = None  # the request's server span, when tracing is on
    enqueued_ns: int = 0  # wall-clock enqueue time for its queue span (tracing on)
    client: Client | None = None  # its connection, when the server tells if it left


@dataclass(frozen=True)
class Taken:
    """What :meth:`RequestQueue.take` removed: a batch to run and requests past their deadline."""

    batch: list[Pending]
    expired: list[Pending]
    removed: int  # everything popped: the batch, the expired, and requests already answered
    abandoned: list[Pending]  # their clients disconnected while they waited


class RequestQueue:
    """FIFO per priority class, with aging across classes."""

    def __init__(self, aging_s: float) -> None:
        self.aging_s = aging_s
        self._classes: tuple[deque[Pending], ...] = (deque(), deque(), deque())
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, pending: Pending) -> None:
        self._classes[pending.priority].append(pending)
        self._size += 1

    def put_back(self, pending: Pending) -> None:
        """Return a request just taken to the head of its class (it did not fit)."""
        self._classes[pending.priority].appendleft(pending)
        self._size += 1

    def oldest_enqueued_at(self) -> float | None:
        heads = [q[0].enqueued_at for q in self._classes if q]
        return min(heads) if heads else None

    def depth_by_priority(self) -> dict[str, int]:
        return {p.name.lower(): len(self._classes[p]) for p in Priority}

    def _effective(self, pending: Pending, now: float) -> tuple[int, float]:
        promoted = int((now - pending.enqueued_at) / self.aging_s) if self.aging_s > 0 else 0
        return max(int(pending.priority) - promoted, 0), pending.enqueued_at

    def _pop_next(self, now: float) -> Pending | None:
        best: deque[Pending] | None = None
        best_key: tuple[int, float] | None = None
        for q in self._classes:
            if q:
                key = self._effective(q[0], now)
                if best_key is None or key < best_key:
                    best, best_key = q, key
        if best is None:
            return None
        self._size -= 1
        return best.popleft()

    def take(self, max_size: int, now: float) -> Taken:
        """Up to ``max_size`` live requests in service order; dead ones are dropped.

        A request already answered (its future is done) is discarded; one whose
        deadline has passed is returned in ``expired`` for a 504, and one whose
        client disconnected in ``abandoned``.
        """
        batch: list[Pending] = []
        expired: list[Pending] = []
        abandoned: list[Pending] = []
        removed = 0
        while len(batch) < max_size:
            pending = self._pop_next(now)
            if pending is None:
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
            pending.started = True
            batch.append(pending)
        return Taken(batch, expired, removed, abandoned)

    def drain(self) -> list[Pending]:
        """Remove and return everything queued."""
        out = [p for q in self._classes for p in q]
        for q in self._classes:
            q.clear()
        self._size = 0
        return out
