"""The Open Inference Protocol body codec, as pure functions over bytes."""

from __future__ import annotations

import gzip
import struct
import zlib
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest

from fnrt.functions.errors import BadRequest, InvalidInput, PayloadTooLarge, UnsupportedMediaType
from fnrt.functions.manifest import TensorSpec
from fnrt.runtime.http.oip.wire import (
    GZIP_MEMBERS,
    RequestedOutput,
    compress,
    decode_request,
    decompress,
    deserialize_bytes,
    encode_response,
    parse_header_length,
    response_encoding,
    serialize_bytes,
)
from fnrt.runtime.queue import Priority

SPECS = {"x": TensorSpec("float32", (-1, 2))}


def x_input(**fields: Any) -> dict:
    """Input ``x`` of SPECS, FP32 [1, 2], with ``fields`` added or changed."""
    return {"name": "x", "shape": [1, 2], "datatype": "FP32", **fields}


#: A well-formed ``x``.
X = x_input(data=[1, 2])


def body(header: dict, *blobs: bytes) -> tuple[bytes, int | None]:
    raw = orjson.dumps(header)
    return (raw + b"".join(blobs), len(raw)) if blobs else (raw, None)


def test_binary_inputs_are_views_of_the_body() -> None:
    x = np.array([[1, 2], [3, 4]], np.float32)
    data, length = body(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [2, 2],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 16},
                }
            ]
        },
        x.tobytes(),
    )
    request = decode_request(data, length, SPECS)
    np.testing.assert_array_equal(request.inputs["x"], x)
    assert not request.inputs["x"].flags.owndata  # no copy of the received bytes
    assert request.outputs is None and request.binary_output is False


@pytest.mark.parametrize("data", [[1, 2, 3, 4], [[1, 2], [3, 4]], [[1.0, 2.0], [3.0, 4.0]]])
def test_json_data_nested_or_flat(data: list) -> None:
    raw, _ = body({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": data}]})
    x = decode_request(raw, None, SPECS).inputs["x"]
    assert x.dtype == np.float32 and x.shape == (2, 2)
    np.testing.assert_array_equal(x, [[1, 2], [3, 4]])


def test_bf16_and_bytes_from_json() -> None:
    raw, _ = body(
        {
            "inputs": [
                {"name": "b", "shape": [1, 2], "datatype": "BF16", "data": [1.5, -2]},
                {"name": "s", "shape": [2], "datatype": "BYTES", "data": ["h\u00e9", "x"]},
            ]
        }
    )
    request = decode_request(raw, None, {})
    assert request.inputs["b"].dtype == ml_dtypes.bfloat16
    assert request.inputs["b"].tolist() == [[1.5, -2.0]]
    assert request.inputs["s"].tolist() == ["h\u00e9".encode(), b"x"]


def test_bytes_tensors_have_length_prefixes() -> None:
    values = np.array([b"ab", b"", b"\xff"], dtype=object)
    packed = serialize_bytes(values)
    assert (
        packed
        == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0) + struct.pack("<I", 1) + b"\xff"
    )
    np.testing.assert_array_equal(deserialize_bytes(memoryview(packed), 3, "s"), values)
    with pytest.raises(BadRequest, match="runs past"):
        deserialize_bytes(memoryview(packed[:-1]), 3, "s")
    with pytest.raises(BadRequest, match="left after"):
        deserialize_bytes(memoryview(packed + b"z"), 3, "s")


@pytest.mark.parametrize(
    ("header", "blobs", "error", "words"),
    [
        ({"inputs": []}, (), BadRequest, "non-empty list"),
        (
            {"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]},
            (),
            BadRequest,
            "string 'name'",
        ),
        ({"inputs": [x_input(datatype="FP33", data=[1, 2])]}, (), BadRequest, "datatype 'FP33'"),
        ({"inputs": [x_input(shape=[1, -2], data=[1, 2])]}, (), BadRequest, "non-negative"),
        ({"inputs": [x_input(data=[1, 2, 3])]}, (), BadRequest, "holds 2 elements, 'data' has 3"),
        ({"inputs": [x_input(data=[[1], [2, 3]])]}, (), BadRequest, "rectangular"),
        ({"inputs": [x_input()]}, (), BadRequest, "needs 'data'"),
        (
            {"inputs": [x_input(datatype="FP64", data=[1, 2])]},
            (),
            InvalidInput,
            "expected datatype FP32, got FP64",
        ),
        ({"inputs": [x_input(data=["a", "b"])]}, (), InvalidInput, "numbers or booleans"),
        (
            {"inputs": [x_input(parameters={"binary_data_size": 4})]},
            (b"\0" * 4,),
            BadRequest,
            "needs 8 bytes",
        ),
        (
            {"inputs": [x_input(parameters={"binary_data_size": 8})]},
            (b"\0" * 4,),
            BadRequest,
            "runs past the body",
        ),
        (
            {"inputs": [x_input(parameters={"binary_data_size": 8})]},
            (b"\0" * 12,),
            BadRequest,
            "4 bytes after the tensors",
        ),
        (
            {"inputs": [x_input(parameters={"shared_memory_region": "r"})]},
            (),
            BadRequest,
            "shared memory",
        ),
        ({"inputs": [X], "parameters": {"sequence_id": 7}}, (), BadRequest, "sequence"),
        (
            {"inputs": [X], "outputs": [{"name": "y", "parameters": {"classification": 3}}]},
            (),
            BadRequest,
            "classification",
        ),
        ({"inputs": [X], "id": 3}, (), BadRequest, "'id' must be a string"),
    ],
)
def test_malformed_requests_say_what_is_wrong(
    header: dict, blobs: tuple[bytes, ...], error: type[Exception], words: str
) -> None:
    raw, length = body(header, *blobs)
    with pytest.raises(error, match=words):
        decode_request(raw, length, SPECS)


def test_not_json_and_bad_header_length() -> None:
    with pytest.raises(BadRequest, match="not valid JSON"):
        decode_request(b"{nope", None, SPECS)
    with pytest.raises(BadRequest, match="outside the body"):
        parse_header_length("99", 10)
    with pytest.raises(BadRequest, match="not a number"):
        parse_header_length("ten", 10)
    assert parse_header_length(None, 10) is None


def test_priority_and_timeout_parameters() -> None:
    def parse(parameters: dict):  # type: ignore[no-untyped-def]
        raw, _ = body({"inputs": [X], "parameters": parameters})
        return decode_request(raw, None, SPECS)

    assert parse({}).priority is None
    assert parse({"priority": 1}).priority is Priority.HIGH
    assert parse({"priority": 2}).priority is Priority.NORMAL
    assert parse({"priority": 9}).priority is Priority.LOW
    assert parse({"timeout": 250_000}).timeout_s == 0.25
    assert parse({"binary_data_output": True}).binary_output is True
    with pytest.raises(BadRequest, match="priority"):
        parse({"priority": -1})


def test_response_binary_and_json_outputs_in_requested_order() -> None:
    raw, _ = body(
        {
            "id": "q",
            "inputs": [X],
            "outputs": [{"name": "s", "parameters": {"binary_data": True}}, {"name": "y"}],
        }
    )
    request = decode_request(raw, None, SPECS)
    y = np.array([[1.5, 2.5]], np.float32)
    s = np.array([b"ab", b"c"], dtype=object)
    out, length = encode_response("m", "v-1", request, {"y": y, "s": s}, {})
    assert length is not None
    header = orjson.loads(out[:length])
    assert header["id"] == "q" and header["model_version"] == "v-1"
    assert [o["name"] for o in header["outputs"]] == ["s", "y"]
    assert header["outputs"][0] == {
        "name": "s",
        "datatype": "BYTES",
        "shape": [2],
        "parameters": {"binary_data_size": 11},
    }
    assert header["outputs"][1]["data"] == [1.5, 2.5]
    assert out[length:] == serialize_bytes(s)


def test_response_all_binary_when_asked_request_wide() -> None:
    raw, _ = body({"inputs": [X], "parameters": {"binary_data_output": True}})
    y = np.array([[1, 2]], ">f4")  # big-endian arrays go out little-endian
    out, length = encode_response("m", "v", decode_request(raw, None, SPECS), {"y": y}, {})
    assert out[length:] == np.array([[1, 2]], "<f4").tobytes()


def test_unknown_output_is_refused() -> None:
    raw, _ = body({"inputs": [X], "outputs": [{"name": "nope"}]})
    with pytest.raises(BadRequest, match="output 'nope' is not an output of 'm'"):
        encode_response("m", "v", decode_request(raw, None, SPECS), {"y": np.zeros(1)}, {})
    assert RequestedOutput("y", None).binary is None


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compression_round_trip_and_bombs(coding: str) -> None:
    data = b"tensor bytes " * 1000
    assert decompress(compress(data, coding), coding, 1 << 20) == data
    with pytest.raises(PayloadTooLarge):
        decompress(compress(b"\0" * 100_000, coding), coding, 10_000)
    with pytest.raises(BadRequest, match="not valid"):
        decompress(b"not compressed", coding, 1 << 20)
    with pytest.raises(BadRequest, match="truncated"):
        decompress(compress(data, coding)[:-8], coding, 1 << 20)


def test_every_member_of_a_gzip_body_is_read_within_the_limit() -> None:
    """A gzip body may be several members one after another (``cat a.gz b.gz``, or a
    client that compresses as it streams): each is read, not the first alone, and the
    limit holds over them all."""
    first, second = b"tensor " * 100, b"bytes " * 100
    two = gzip.compress(first) + gzip.compress(second)
    assert decompress(two, "gzip", 1 << 20) == first + second
    assert decompress(two + b"\0" * 8, "gzip", 1 << 20) == first + second  # padding
    with pytest.raises(PayloadTooLarge):
        decompress(two, "gzip", len(first) + len(second) - 1)
    with pytest.raises(BadRequest, match="not gzip"):
        decompress(gzip.compress(first) + b"trailing junk", "gzip", 1 << 20)
    with pytest.raises(BadRequest, match="truncated"):
        decompress(two[:-8], "gzip", 1 << 20)
    with pytest.raises(BadRequest, match="members"):
        decompress(gzip.compress(b"") * (GZIP_MEMBERS + 1), "gzip", 1 << 20)
    assert decompress(gzip.compress(b"x") * GZIP_MEMBERS, "gzip", 1 << 20) == b"x" * GZIP_MEMBERS
    with pytest.raises(BadRequest, match="after its end"):  # deflate: one stream
        decompress(compress(first, "deflate") + b"junk", "deflate", 1 << 20)


def test_raw_deflate_and_identity_and_unknown_codings() -> None:
    raw_deflate = zlib.compressobj(wbits=-15)
    packed = raw_deflate.compress(b"abc") + raw_deflate.flush()
    assert decompress(packed, "deflate", 100) == b"abc"
    assert decompress(b"abc", None, 100) == b"abc"
    assert decompress(gzip.compress(b"abc"), "x-gzip", 100) == b"abc"
    with pytest.raises(UnsupportedMediaType, match="br"):
        decompress(b"abc", "br", 100)


@pytest.mark.parametrize(
    ("header", "chosen"),
    [
        (None, None),
        ("identity", None),
        ("gzip", "gzip"),
        ("deflate, gzip;q=0.5", "deflate"),
        ("gzip;q=0, br", None),
        ("br;q=1, gzip;q=0.8", "gzip"),
    ],
)
def test_response_encoding(header: str | None, chosen: str | None) -> None:
    assert response_encoding(header) == chosen
