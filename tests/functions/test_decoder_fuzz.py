"""Fuzzing the body decoders: whatever the bytes, a clear FnrtError or a value, never a crash.

CI-sized: a few thousand cases in all, seeded (derandomized) so a failure replays.
"""

from __future__ import annotations

import contextlib
import json
import os

import msgpack
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fnrt.functions.codec import decode_json, decode_msgpack, encode_json, encode_msgpack
from fnrt.functions.errors import FnrtError
from fnrt.functions.limits import TensorLimits
from fnrt.functions.manifest import TensorSpec
from fnrt.functions.tensors import coerce_request
from fnrt.runtime.http.oip.wire import decode_request

#: CI-sized; FNRT_FUZZ_EXAMPLES=20000 for a long run.
FUZZ = settings(
    max_examples=int(os.environ.get("FNRT_FUZZ_EXAMPLES", "400")),
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
LIMITS = TensorLimits(max_elements=1 << 20)
SPECS = {"x": TensorSpec("float32", (-1, 4))}

dims = st.integers(min_value=-3, max_value=1 << 40)
scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
)
plain = st.recursive(
    scalars | st.binary(max_size=16),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=20,
)
nd_arrays = st.fixed_dictionaries(
    {
        "nd": st.booleans() | st.none(),
        "type": st.sampled_from(
            ["<f4", "<i8", "|u1", ">f8", "|b1", "O", "V8", "<U4", "bfloat16", "x"]
        ),
        "kind": st.sampled_from(["", "O", "V", 3]),
        "shape": st.lists(dims, max_size=6) | scalars,
        "data": st.binary(max_size=64) | scalars,
    }
)
bodies = st.dictionaries(st.text(max_size=4), nd_arrays | plain, max_size=3)


def survives(call) -> None:  # type: ignore[no-untyped-def]
    with contextlib.suppress(FnrtError):  # a clear error, with its status: fine
        call()


@FUZZ
@given(st.binary(max_size=256))
def test_msgpack_of_any_bytes(body: bytes) -> None:
    survives(lambda: decode_msgpack(body, LIMITS))


@FUZZ
@given(bodies)
def test_msgpack_of_crafted_arrays(payload: dict) -> None:
    body = msgpack.packb(payload, use_bin_type=True)
    survives(lambda: coerce_request(SPECS, decode_msgpack(body, LIMITS)))
    survives(lambda: coerce_request({}, decode_msgpack(body, LIMITS)))


@FUZZ
@given(st.binary(max_size=256))
def test_json_of_any_bytes(body: bytes) -> None:
    survives(lambda: decode_json(body))


@FUZZ
@given(st.dictionaries(st.text(max_size=4), plain, max_size=3))
def test_json_of_crafted_values(payload: dict) -> None:
    try:
        body = json.dumps(payload, allow_nan=True).encode()
    except (TypeError, ValueError):
        return  # bytes leaves: not JSON
    survives(lambda: coerce_request(SPECS, decode_json(body)))
    survives(lambda: coerce_request({}, decode_json(body)))


oip_inputs = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(["x", "y"]) | scalars,
            "datatype": st.sampled_from(["FP32", "INT64", "BYTES", "BOOL", "BF16", "FP99"])
            | scalars,
            "shape": st.lists(dims, max_size=5) | scalars,
        },
        optional={
            "data": plain,
            "parameters": st.dictionaries(
                st.sampled_from(["binary_data_size", "other"]), st.integers(-5, 1 << 40) | scalars
            ),
        },
    ),
    max_size=3,
)


@FUZZ
@given(oip_inputs, st.binary(max_size=64), st.booleans())
def test_oip_infer_requests(inputs: list, binary: bytes, with_header_length: bool) -> None:
    try:
        head = json.dumps({"inputs": inputs}).encode()
    except (TypeError, ValueError):
        return  # bytes leaves: not JSON
    body = head + binary if with_header_length else head
    length = len(head) if with_header_length else None
    survives(lambda: decode_request(body, length, SPECS, LIMITS, 1 << 16))
    survives(lambda: decode_request(body, length, {}, LIMITS, 1 << 16))


@FUZZ
@given(st.lists(st.integers(0, 7), max_size=4), st.sampled_from(["<f4", "|u1", "<i8", "|b1"]))
def test_what_is_decoded_encodes_back(shape: list[int], dtype: str) -> None:
    array = np.zeros(shape, dtype=dtype)
    back = decode_msgpack(encode_msgpack({"y": array}), LIMITS)["y"]
    assert back.shape == array.shape and back.dtype == array.dtype
    assert json.loads(encode_json({"y": array}))["y"] == array.tolist()
