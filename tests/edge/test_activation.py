"""The activation body: float32 as is, float16 and int8 (with its scale) compressed."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from fnrt.edge.activation import Encoding, pack, read_outputs, unpack
from fnrt.functions.codec import encode_msgpack
from fnrt.functions.errors import BadRequest, InvalidInput

A = np.random.default_rng(0).normal(size=(2, 8, 4, 4)).astype(np.float32)


def test_float32_goes_unchanged() -> None:
    body = pack(A)
    assert np.array_equal(unpack(body), A)
    assert len(body) < A.nbytes + 200


@pytest.mark.parametrize(("encoding", "ratio", "atol"), [("float16", 2, 4e-3), ("int8", 4, None)])
def test_compressed_encodings_shrink_the_body_within_their_error(
    encoding: str, ratio: int, atol: float | None
) -> None:
    enc = Encoding.parse(encoding)
    body = pack(A, enc)
    back = unpack(body)
    assert back.dtype == np.float32 and back.shape == A.shape
    assert len(body) < A.nbytes / ratio + 200
    bound = atol if atol is not None else float(np.abs(A).max()) / 127 / 2 + 1e-7
    assert float(np.abs(back - A).max()) <= bound


def test_an_all_zero_activation_quantises_without_dividing_by_zero() -> None:
    zeros = np.zeros((1, 3), dtype=np.float32)
    assert np.array_equal(unpack(pack(zeros, Encoding.INT8)), zeros)


def test_the_client_reads_what_the_server_encodes() -> None:
    y = np.arange(20, dtype=np.float32).reshape(2, 10)
    out = read_outputs(encode_msgpack({"y": y}))
    assert np.array_equal(out["y"], y)


@pytest.mark.parametrize(
    ("payload", "error", "message"),
    [
        ({"x": 1}, BadRequest, "'activation' array"),
        ({"activation": A, "other": 1}, BadRequest, "unknown keys"),
        ({"activation": A.astype(np.int8)}, InvalidInput, "needs a 'scale'"),
        ({"activation": A.astype(np.int8), "scale": -1.0}, InvalidInput, "needs a 'scale'"),
        ({"activation": A, "scale": 0.5}, InvalidInput, "only with an int8"),
        ({"activation": A.astype(np.float64)}, InvalidInput, "float32, float16, int8"),
        # finite as a Python float, inf once applied in float32: inf and NaN outputs
        ({"activation": A.astype(np.int8), "scale": 1e300}, InvalidInput, "finite"),
    ],
)
def test_malformed_bodies_are_refused(
    payload: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        unpack(encode_msgpack(payload))


def test_not_msgpack_is_a_bad_request() -> None:
    with pytest.raises(BadRequest):
        unpack(b"\xc1 not msgpack")
    with pytest.raises(BadRequest):
        unpack(msgpack.packb([1, 2]))


def test_unknown_encodings_are_named() -> None:
    with pytest.raises(ValueError, match="float32"):
        Encoding.parse("int4")


def test_an_integer_activation_travels_as_it_is_whatever_the_encoding() -> None:
    """A model's own integer input at split 0 (token ids): rounded to float16 or
    quantised to int8 it would be other ids."""
    ids = np.array([[4095, 3001, 2049, 17]], np.int64)
    for encoding in Encoding:
        got = unpack(pack(ids, encoding))
        assert got.dtype == np.int64 and np.array_equal(got, ids)
