"""Staged batches on the CPU's lanes: stacking, double buffering, ordering, errors."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import torch

from fnrt.functions.errors import HandlerError
from fnrt.functions.manifest import TensorSpec
from fnrt.loader.staging import Stager
from fnrt.loader.streams import Lanes

IN = {"x": TensorSpec("float32", (-1, 4)), "k": TensorSpec("int64", (-1,))}
OUT = {"y": TensorSpec("float32", (-1, 2)), "n": TensorSpec("int64", (-1,))}
WEIGHTS = torch.arange(8, dtype=torch.float32).reshape(4, 2)


def forward(inputs: dict[str, Any]) -> dict[str, Any]:
    return {"y": inputs["x"] @ WEIGHTS, "n": inputs["k"] * 10}


def request(rows: int, seed: int) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    return {"x": x, "k": np.arange(rows, dtype=np.int64) + seed}


def expected(r: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
    return {"y": r["x"] @ WEIGHTS.numpy(), "n": r["k"] * 10}


def test_a_batch_is_stacked_computed_and_split_per_request() -> None:
    stager = Stager(forward, IN, OUT, Lanes())
    batch = [request(rows, seed) for seed, rows in enumerate([3, 1, 5])]
    results = stager.run(batch)
    assert len(results) == 3
    for got, r in zip(results, batch, strict=True):
        want = expected(r)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got["n"], want["n"])
        assert got["y"].dtype == np.float32 and got["n"].dtype == np.int64
    stager.close()


def test_buffers_grow_for_a_larger_batch_and_are_reused_after() -> None:
    stager = Stager(forward, IN, OUT, Lanes())
    small = [request(1, 0)]
    big = [request(40, s) for s in range(8)]
    for batch in (small, big, small, big):
        for got, r in zip(stager.run(batch), batch, strict=True):
            np.testing.assert_allclose(got["y"], expected(r)["y"], rtol=1e-5, atol=1e-6)
    sizes = {slot.host_in["x"].nbytes for slot in stager._slots if "x" in slot.host_in}
    assert max(sizes) >= 320 * 4 * 4  # 320 rows of 4 float32
    stager.close()


def test_a_third_batch_waits_for_a_slot_and_stage_overlaps_compute() -> None:
    """Two slots: batch 2 stages while batch 1 computes; batch 3 waits for a free slot."""
    entered, release = threading.Event(), threading.Event()

    def slow(inputs: dict[str, Any]) -> dict[str, Any]:
        if int(inputs["k"][0]) == 100:  # batch 1 blocks inside forward
            entered.set()
            assert release.wait(10)
        return forward(inputs)

    stager = Stager(slow, IN, OUT, Lanes())
    one = [request(2, 100)]
    first = stager.stage(one)
    computing = stager.host_lane.submit(lambda: None)  # the host lane is free
    computing.result()
    results: list[Any] = []
    worker = threading.Thread(target=lambda: results.append(stager.compute(first)))
    worker.start()
    assert entered.wait(10)
    second = stager.host_lane.submit(stager.stage, [request(3, 7)]).result(timeout=10)
    third = stager.host_lane.submit(stager.stage, [request(1, 8)])
    time.sleep(0.2)
    assert not third.done()  # both slots held: batch 1 computing, batch 2 staged
    release.set()
    worker.join(10)
    staged3 = third.result(timeout=10)  # batch 1's slot came free
    np.testing.assert_array_equal(results[0][0][0]["n"], expected(one[0])["n"])
    got2, _ = stager.compute(second)
    np.testing.assert_array_equal(got2[0]["n"], np.array([70, 80, 90]))
    got3, times = stager.compute(staged3)
    np.testing.assert_array_equal(got3[0]["n"], np.array([80]))
    assert times.stack_s >= 0 and times.compute_s >= 0
    stager.close()


def test_released_staged_batches_give_their_slot_back() -> None:
    stager = Stager(forward, IN, OUT, Lanes())
    for _ in range(5):
        stager.release(stager.stage([request(1, 0)]))
    assert not any(slot.busy for slot in stager._slots)
    stager.close()


def test_bad_forward_outputs_fail_the_batch_and_free_the_slot() -> None:
    answers: list[Any] = [
        ["not a mapping"],
        {"y": torch.zeros(2, 2)},  # "n" missing
        {"y": torch.zeros(5, 2), "n": torch.zeros(5, dtype=torch.int64)},  # 5 rows, not 2
        {"y": torch.tensor(1.0), "n": torch.zeros(2, dtype=torch.int64)},  # no rows at all
    ]
    messages = ["mapping", "do not match the declared outputs", "2 rows", "2 rows"]
    for answer, message in zip(answers, messages, strict=True):
        stager = Stager(lambda inputs, a=answer: a, IN, OUT, Lanes())
        with pytest.raises(ValueError, match=message):
            stager.run([request(2, 0)])
        assert not any(slot.busy for slot in stager._slots)
        stager.close()


def test_requests_whose_rows_disagree_are_refused_by_name() -> None:
    stager = Stager(forward, IN, OUT, Lanes())
    bad = {"x": np.zeros((2, 4), np.float32), "k": np.zeros(3, np.int64)}
    with pytest.raises(ValueError, match="request 1: input 'k' has shape \\[3\\]"):
        stager.run([request(1, 0), bad])
    assert not any(slot.busy for slot in stager._slots)
    assert stager.run([request(1, 0)])[0]["n"].tolist() == [0]
    stager.close()


def test_inputs_without_a_rows_dimension_cannot_be_staged() -> None:
    with pytest.raises(HandlerError, match=r"first dimension is -1.*image"):
        Stager(forward, {"image": TensorSpec("float32", (3, 8, 8))}, OUT, Lanes())


def test_bfloat16_inputs_reach_forward_as_bfloat16() -> None:
    seen: list[Any] = []

    def keep(inputs: dict[str, Any]) -> dict[str, Any]:
        seen.append(inputs["x"].dtype)
        return {"y": inputs["x"].float()}

    specs = {"x": TensorSpec("bfloat16", (-1, 2))}
    stager = Stager(keep, specs, {"y": TensorSpec("float32", (-1, 2))}, Lanes())
    from fnrt.functions.dtypes import numpy_dtype

    x = np.array([[1.5, -2.0]], dtype=numpy_dtype("bfloat16"))
    (got,) = stager.run([{"x": x}])
    assert seen == [torch.bfloat16]
    assert got["y"].tolist() == [[1.5, -2.0]]
    stager.close()


def test_a_batch_past_the_pinned_limit_is_staged_in_ordinary_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Page-locked memory is RAM the OS cannot page out: a burst of the largest bodies
    must not lock that much; above the limit the buffers are ordinary memory."""
    import fnrt.loader.staging as staging

    asked: list[int] = []

    class Counting(Lanes):
        def host_buffer(self, nbytes: int) -> Any:
            asked.append(nbytes)
            return super().host_buffer(nbytes)

    monkeypatch.setattr(staging, "MAX_PINNED_BYTES", 1024)
    stager = Stager(forward, IN, OUT, Counting())
    stager.run([request(4, 0)])  # 64 bytes of x: through the lanes
    assert asked and max(asked) <= 1024
    asked.clear()
    big = [request(200, 1)]  # 3,200 bytes of x
    (got,) = stager.run(big)
    np.testing.assert_allclose(got["y"], expected(big[0])["y"], rtol=1e-5, atol=1e-6)
    assert all(n <= 1024 for n in asked)  # x's buffer did not come from the lanes
    stager.close()


def test_outputs_that_are_views_of_the_inputs_outlive_the_slot() -> None:
    """A forward that returns (a slice of) its input: the answer must not change when
    the slot is staged again for the next batch."""
    out = {"y": TensorSpec("float32", (-1, 2))}
    stager = Stager(lambda inputs: {"y": inputs["x"][:, :2]}, IN, out, Lanes(), depth=1)
    first = stager.run([request(3, 0)])
    kept = first[0]["y"].copy()
    stager.run([request(3, 99)])  # the one slot, staged again with other values
    np.testing.assert_array_equal(first[0]["y"], kept)
    stager.close()
