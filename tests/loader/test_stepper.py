"""The stepper: what a generative instance does per step, in its thread or worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fnrt.functions.generation import LENGTH, STOP, Chunk, Joining, Sequence, StepBatch
from fnrt.loader.stepper import Stepper
from support import COUNTER_MANIFEST, packed, write_function


class Recorder:
    """Counts up from each prompt; done at ``until``; logs every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self.fail: str | None = None

    def start(self, sequences: list[Sequence]) -> list[Any]:
        self.calls.append(("start", [s.id for s in sequences]))
        if self.fail == "start":
            raise ValueError("start failed")
        for s in sequences:
            s.state = int(s.inputs["x"][0])
        return [self._emit(s) for s in sequences]

    def step(self, sequences: list[Sequence]) -> list[Any]:
        self.calls.append(("step", [s.id for s in sequences]))
        if self.fail == "step":
            raise ValueError("step failed")
        return [self._emit(s) for s in sequences]

    def stop(self, sequences: list[Sequence]) -> None:
        self.calls.append(("stop", [s.id for s in sequences]))

    def _emit(self, s: Sequence) -> Any:
        s.state += 1
        out = {"n": [s.state], "text": [b"."]}
        until = s.parameters.get("until")
        return Chunk(out, done=until == s.state) if until else out  # a bare mapping goes on


@pytest.fixture
def stepper(tmp_path: Path) -> tuple[Stepper, Recorder]:
    folder = write_function(tmp_path, "c", "", COUNTER_MANIFEST, max_active=4, max_queue=8,
                            mode="thread")  # fmt: skip
    handler = Recorder()
    return Stepper(handler, packed(folder)[0]), handler


def join(id_: int, x: int, max_new: int = 10, **params: Any) -> Joining:
    return Joining(id_, {"x": np.array([x])}, params, max_new)


def test_joining_start_continuing_step_and_finished_ones_stop(
    stepper: tuple[Stepper, Recorder],
) -> None:
    run, handler = stepper
    first = run(StepBatch([join(1, 0, until=2), join(2, 10, max_new=2)]))
    assert first.ids == [1, 2] and first.ended == [None, None]
    assert [o["n"].tolist() for o in first.outputs] == [[1], [11]]
    second = run(StepBatch([join(3, 100)]))
    assert second.ids == [1, 2, 3]  # the active ones step, then the new one starts
    assert second.ended == [STOP, LENGTH, None]
    assert handler.calls == [("start", [1, 2]), ("step", [1, 2]), ("start", [3]), ("stop", [1, 2])]
    assert list(run.active) == [3]
    third = run(StepBatch([], leaving=[3]))
    assert third.ids == [] and handler.calls[-1] == ("stop", [3]) and not run.active


def test_a_failed_step_drops_every_sequence_in_it(stepper: tuple[Stepper, Recorder]) -> None:
    run, handler = stepper
    run(StepBatch([join(1, 0), join(2, 0)]))
    handler.fail = "step"
    with pytest.raises(ValueError, match="step failed"):
        run(StepBatch([join(3, 0)]))
    assert not run.active
    assert handler.calls[-1] == ("stop", [1, 2, 3])  # told, so it can free their state


def test_chunks_are_checked_against_the_outputs(stepper: tuple[Stepper, Recorder]) -> None:
    run, handler = stepper
    handler._emit = lambda s: {"n": [1, 2], "text": [b"."]}  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="output 'n' has shape"):
        run(StepBatch([join(1, 0)]))
    handler._emit = lambda s: "nope"  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="Chunk"):
        run(StepBatch([join(2, 0)]))
    handler.start = lambda seqs: []  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="0 chunks for 1 sequences"):
        run(StepBatch([join(3, 0)]))
    assert not run.active


def test_close_lets_every_active_sequence_go(stepper: tuple[Stepper, Recorder]) -> None:
    run, handler = stepper
    run(StepBatch([join(1, 0), join(2, 0)]))
    run.close()
    assert handler.calls[-1] == ("stop", [1, 2]) and not run.active
