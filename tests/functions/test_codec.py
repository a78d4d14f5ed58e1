from __future__ import annotations

import msgpack
import msgpack_numpy
import numpy as np
import pytest

from fnrt.functions.codec import (
    Format,
    NotJsonNumber,
    decode_json,
    decode_msgpack,
    encode_json,
    encode_msgpack,
    format_of,
    negotiate,
)
from fnrt.functions.errors import BadRequest, UnsupportedMediaType


@pytest.mark.parametrize(
    "dtype", ["bool", "uint8", "int16", "int32", "int64", "float16", "float32", "float64"]
)
def test_msgpack_numpy_compatible_both_ways(dtype: str) -> None:
    x = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    ours = decode_msgpack(msgpack.packb({"x": x}, default=msgpack_numpy.encode))["x"]
    np.testing.assert_array_equal(ours, x)
    assert ours.dtype == x.dtype
    theirs = msgpack.unpackb(encode_msgpack({"x": x}), object_hook=msgpack_numpy.decode)["x"]
    np.testing.assert_array_equal(theirs, x)


def test_decoding_does_not_copy_the_data() -> None:
    body = msgpack.packb({"x": np.ones((256, 256), np.float32)}, default=msgpack_numpy.encode)
    x = decode_msgpack(body)["x"]
    assert not x.flags.owndata  # a view over the received bytes
    assert not x.flags.writeable


def test_non_contiguous_and_big_endian_arrays_encode() -> None:
    x = np.arange(20, dtype=">i4").reshape(4, 5)[:, ::2]
    out = msgpack.unpackb(encode_msgpack({"x": x}), object_hook=msgpack_numpy.decode)["x"]
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (
            {b"nd": True, b"type": "|O", b"kind": b"O", b"shape": [1], b"data": b"x"},
            "object or structured",
        ),
        (
            {b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [2], b"data": b"abc"},
            "needs 8 bytes, got 3",
        ),
        (
            {b"nd": True, b"type": "<U3", b"kind": b"", b"shape": [1], b"data": b"abcabcabcabc"},
            "not a numeric",
        ),
        ({b"nd": True, b"type": "zz", b"kind": b"", b"shape": [1], b"data": b""}, "unknown dtype"),
        ({b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [-1], b"data": b""}, "non-negative"),
    ],
)
def test_bad_arrays_are_bad_requests(payload: dict, words: str) -> None:
    with pytest.raises(BadRequest, match=words):
        decode_msgpack(msgpack.packb({"x": payload}))


def test_json_round_trip_and_errors() -> None:
    assert decode_json(b'{"x": [[1, 2]]}') == {"x": [[1, 2]]}
    assert encode_json({"y": np.array([[1.5, 2.0]], np.float32)}) == b'{"y":[[1.5,2.0]]}'
    assert encode_json({"y": np.array([1, 2], ">i4")}) == b'{"y":[1,2]}'
    with pytest.raises(BadRequest, match="not valid JSON"):
        decode_json(b"{")
    with pytest.raises(BadRequest, match="must be a map"):
        decode_json(b"[]")
    with pytest.raises(BadRequest, match="input names must be strings"):
        decode_msgpack(msgpack.packb({1: 2}))


def test_content_negotiation() -> None:
    assert format_of(None) is Format.JSON
    assert format_of("application/msgpack; charset=binary") is Format.MSGPACK
    assert format_of("application/x-msgpack") is Format.MSGPACK
    with pytest.raises(UnsupportedMediaType):
        format_of("text/csv")
    assert negotiate(None, Format.MSGPACK) is Format.MSGPACK
    assert negotiate("*/*", Format.MSGPACK) is Format.MSGPACK
    assert negotiate("text/html, application/json;q=0.9", Format.MSGPACK) is Format.JSON
    with pytest.raises(UnsupportedMediaType):
        negotiate("text/html", Format.JSON)


def test_a_zero_dimensional_array_keeps_its_shape() -> None:
    """Found by the decoder fuzz: 0-d arrays came back with shape [1]."""
    back = decode_msgpack(encode_msgpack({"y": np.full((), 2.5, dtype=np.float32)}))["y"]
    assert back.shape == () and float(back) == 2.5


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_json_refuses_nan_and_infinities_rather_than_writing_null(bad: float) -> None:
    import ml_dtypes

    for dtype in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16):
        with pytest.raises(NotJsonNumber, match="output 'y' holds NaN or infinite"):
            encode_json({"y": np.array([1.0, bad], dtype=dtype)})
    assert encode_json({"y": np.array([1.0, 2.5], np.float32)}) == b'{"y":[1.0,2.5]}'
    assert encode_json({"n": np.array([0, 1], np.int64), "s": "text"}) == b'{"n":[0,1],"s":"text"}'
    # a null that is data, not a NaN written as one, passes
    assert encode_json({"y": np.array([1.0], np.float32), "s": "null", "z": None}) == (
        b'{"y":[1.0],"s":"null","z":null}'
    )
    kept = decode_msgpack(encode_msgpack({"y": np.array([bad], np.float32)}))["y"]
    np.testing.assert_array_equal(kept, [bad])  # msgpack carries them as they are
