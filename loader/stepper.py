"""Driving a generative handler one step at a time, where its instance runs.

A :class:`Stepper` holds the instance's active sequences. Per step
(:class:`~fnrt.functions.generation.StepBatch`) it lets the leaving ones go
(``stop``), advances the others (``step``), begins the joining ones
(``start``), checks every chunk against ``[outputs]``, and ends sequences
that are done or at their ``max_new_tokens`` (``stop`` again). It runs on
the instance's thread, in the server (thread isolation) or in the worker
process, and is the same code in both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from fnrt.functions.generation import LENGTH, STOP, Chunk, Sequence, StepBatch, Stepped
from fnrt.functions.tensors import coerce_result
from fnrt.functions.version import VersionManifest

#: Calls a handler method (a coroutine runs to completion on the instance's loop).
Invoke = Callable[..., Any]


def _plain(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class Stepper:
    """A generative handler and its instance's active sequences."""

    def __init__(self, handler: Any, vm: VersionManifest, invoke: Invoke = _plain) -> None:
        self._handler = handler
        self._outputs = vm.manifest.outputs
        self._invoke = invoke
        self._stop = getattr(handler, "stop", None)
        self.active: dict[int, Sequence] = {}  # in the order they joined

    def __call__(self, batch: StepBatch) -> Stepped:
        leaving = [self.active.pop(i) for i in batch.leaving if i in self.active]
        if leaving:
            self._release(leaving)
        going = list(self.active.values())
        joining = [Sequence(j.id, j.inputs, j.parameters, j.max_new_tokens) for j in batch.joining]
        started = time.perf_counter()
        try:
            chunks = self._call("step", going) if going else []
            chunks += self._call("start", joining) if joining else []
        except BaseException:
            # the step failed for every sequence in it: none of them goes on
            self.active.clear()
            self._release(going + joining, quiet=True)
            raise
        called = time.perf_counter()
        sequences = going + joining
        ids: list[int] = []
        outputs = []
        ended: list[str | None] = []
        finished = []
        try:
            for seq, chunk in zip(sequences, chunks, strict=True):
                outputs.append(coerce_result(self._outputs, chunk.outputs))
                seq.generated += 1
                at_limit = seq.generated >= seq.max_new_tokens
                why = STOP if chunk.done else LENGTH if at_limit else None
                ids.append(seq.id)
                ended.append(why)
                if why is not None:
                    finished.append(seq)
        except BaseException:
            self.active.clear()
            self._release(sequences, quiet=True)
            raise
        for seq in joining:
            self.active[seq.id] = seq
        for seq in finished:
            del self.active[seq.id]
        if finished:
            self._release(finished)
        return Stepped(ids, outputs, ended, called - started, time.perf_counter() - called)

    def _call(self, method: str, sequences: list[Sequence]) -> list[Chunk]:
        out = self._invoke(getattr(self._handler, method), sequences)
        if isinstance(out, Mapping | str | bytes) or not isinstance(out, list | tuple):
            raise ValueError(
                f"{method} must return a list with one Chunk per sequence, got {type(out).__name__}"
            )
        if len(out) != len(sequences):
            raise ValueError(f"{method} returned {len(out)} chunks for {len(sequences)} sequences")
        return [_as_chunk(method, c) for c in out]

    def _release(self, sequences: list[Sequence], *, quiet: bool = False) -> None:
        if self._stop is None or not sequences:
            return
        try:
            self._invoke(self._stop, sequences)
        except Exception:
            if not quiet:
                raise

    def close(self) -> None:
        """Let every active sequence go (the instance is ending)."""
        going, self.active = list(self.active.values()), {}
        self._release(going, quiet=True)


def _as_chunk(method: str, value: Any) -> Chunk:
    if isinstance(value, Chunk):
        return value
    if isinstance(value, Mapping):  # outputs alone: the sequence goes on
        return Chunk(value)
    raise ValueError(
        f"{method} must return Chunk(outputs, done) per sequence, got {type(value).__name__}"
    )
