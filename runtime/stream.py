"""A generated answer on its way to the client: chunks as steps make them, then the end.

The :class:`~fnrt.runtime.sequencer.Sequencer` pushes each chunk of a
sequence into its :class:`Stream` and ends it with a reason and the
sequence's usage (or an error); the HTTP layer reads it as an async iterator.
A reader that goes away calls :meth:`Stream.cancel`: the sequence leaves the
batch at the next step.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fnrt.functions.errors import FnrtError
from fnrt.loader.instance import LoadTier

Outputs = dict[str, np.ndarray[Any, Any]]


@dataclass(frozen=True)
class Usage:
    """What a finished sequence took."""

    prompt_tokens: int
    completion_tokens: int  # chunks generated
    queue_s: float  # from arrival to joining a step
    time_to_first_token_s: float  # from arrival to its first chunk
    total_s: float  # from arrival to its end

    @property
    def time_per_output_token_s(self) -> float:
        """Between the first chunk and the last, per chunk after the first."""
        if self.completion_tokens < 2:
            return 0.0
        return (self.total_s - self.time_to_first_token_s) / (self.completion_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "queue_ms": round(self.queue_s * 1000, 3),
            "time_to_first_token_ms": round(self.time_to_first_token_s * 1000, 3),
            "time_per_output_token_ms": round(self.time_per_output_token_s * 1000, 3),
            "total_ms": round(self.total_s * 1000, 3),
        }


@dataclass(frozen=True)
class Ended:
    """Why a sequence ended (``stop``, ``length``, ``deadline``, ``cancelled``), and its usage."""

    reason: str
    usage: Usage


class Stream:
    """The chunks of one sequence, in order, then its end (or its error)."""

    def __init__(self, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.cold_tier: LoadTier | None = None  # set when it waited for a load
        self.ended: Ended | None = None
        self.error: FnrtError | None = None
        self.cancelled = False  # its reader went away
        self._chunks: deque[Outputs] = deque()
        self._waiter: asyncio.Future[None] | None = None

    @property
    def done(self) -> bool:
        return self.ended is not None or self.error is not None

    # --- the sequencer's side ---------------------------------------------------------

    def push(self, outputs: Outputs) -> None:
        self._chunks.append(outputs)
        self._wake()

    def end(self, reason: str, usage: Usage) -> None:
        if not self.done:
            self.ended = Ended(reason, usage)
            self._wake()

    def fail(self, error: FnrtError) -> None:
        if not self.done:
            self.error = error
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- the reader's side ------------------------------------------------------------

    def cancel(self) -> None:
        """The reader is gone: the sequence leaves at the next step."""
        self.cancelled = True

    async def next(self) -> Outputs | None:
        """The next chunk; None once the stream has ended; the error if it failed
        (chunks made before a failure are read first)."""
        while not self._chunks:
            if self.error is not None:
                raise self.error
            if self.ended is not None:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._chunks.popleft()

    async def __aiter__(self) -> AsyncIterator[Outputs]:
        while True:
            chunk = await self.next()
            if chunk is None:
                return
            yield chunk
