"""Open Inference Protocol v2 bodies: JSON tensors and the binary tensor extension.

Pure functions over bytes; the routes own the HTTP side. A request body is a
JSON header, optionally followed by raw tensor bytes when the
``Inference-Header-Content-Length`` header says how long the JSON is; each
binary input says its size in ``parameters.binary_data_size`` and the
tensors follow in input order. Numeric tensors are raw little-endian,
row-major; BYTES tensors are each element as a 4-byte little-endian length
and its bytes. Binary inputs become numpy arrays over the received bytes
without a copy. Responses mirror that: outputs asked for with ``binary_data``
(or the request-wide ``binary_data_output``) go after the JSON.

Bodies may be compressed (``Content-Encoding`` / ``Accept-Encoding``:
``gzip`` or ``deflate``), as tritonclient does when asked.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from fnrt.functions.codec import NotJsonText, check_json_numbers
from fnrt.functions.dtypes import DTYPE_OF_DATATYPE, OIP_DATATYPES, name_of, numpy_dtype
from fnrt.functions.errors import (
    BadRequest,
    FnrtError,
    InvalidInput,
    PayloadTooLarge,
    ResponseTooLarge,
    UnsupportedMediaType,
)
from fnrt.functions.limits import (
    DEFAULT_LIMITS,
    TensorLimits,
    check_shape,
    json_bytes,
    packed_bytes,
)
from fnrt.functions.manifest import TensorSpec
from fnrt.functions.tensors import from_plain
from fnrt.runtime.queue import Priority

Array = np.ndarray[Any, Any]

HEADER_LENGTH = "inference-header-content-length"
_LENGTH = struct.Struct("<I")
_UNSUPPORTED_PARAMETERS = {
    "shared_memory_region": "shared memory is not supported: send the tensor in the body",
    "classification": "the classification extension is not supported",
    "sequence_id": "sequence batching is not supported",
}


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool | None  # None: the request's binary_data_output decides


@dataclass(frozen=True)
class InferRequest:
    """A decoded infer request: inputs as arrays, and how to answer."""

    id: str | None
    inputs: dict[str, Array]
    outputs: tuple[RequestedOutput, ...] | None  # None: every output
    binary_output: bool
    priority: Priority | None
    timeout_s: float | None


# --- compression ------------------------------------------------------------------

#: The most gzip members a body may hold (``cat a.gz b.gz`` makes two; gzip -d reads
#: every one): past it, a body of many empty members costs more than it carries.
GZIP_MEMBERS = 64


def decompress(body: bytes, encoding: str | None, limit_bytes: int) -> bytes:
    """The body without its ``Content-Encoding``, refused beyond ``limit_bytes`` inflated."""
    coding = (encoding or "identity").strip().lower()
    if coding == "identity":
        return body
    if coding not in ("gzip", "deflate", "x-gzip"):
        raise UnsupportedMediaType(
            f"unsupported Content-Encoding {coding!r}: use gzip, deflate or none"
        )
    # wbits: 16+ reads gzip; + (zlib) for deflate, with raw deflate tried next (some clients)
    attempts = (31,) if coding != "deflate" else (15, -15)
    for wbits in attempts:
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(body, limit_bytes + 1)
        except zlib.error:
            continue
        parts = [out]
        while True:
            if len(out) > limit_bytes or inflater.unconsumed_tail:
                raise PayloadTooLarge(limit_bytes)
            if not inflater.eof:
                raise BadRequest(f"the {coding} body is truncated")
            rest = inflater.unused_data
            if wbits == 31:  # gzip: members one after another, zero bytes between them
                rest = rest.lstrip(b"\0")
            if not rest:
                return parts[0] if len(parts) == 1 else b"".join(parts)
            if wbits != 31:
                raise BadRequest(f"the {coding} body has data after its end")
            if len(parts) >= GZIP_MEMBERS:
                raise BadRequest(f"the gzip body has more than {GZIP_MEMBERS} members")
            limit_bytes -= len(out)
            inflater = zlib.decompressobj(wbits)
            try:
                out = inflater.decompress(rest, limit_bytes + 1)
            except zlib.error:
                raise BadRequest("the gzip body has data after its end that is not gzip") from None
            parts.append(out)
    raise BadRequest(f"the body is not valid {coding} data")


def response_encoding(accept_encoding: str | None) -> str | None:
    """``gzip`` or ``deflate`` when the client accepts one (by q-value), else None."""
    if not accept_encoding:
        return None
    best: tuple[float, str] | None = None
    for part in accept_encoding.split(","):
        coding, _, params = part.strip().partition(";")
        coding = coding.strip().lower()
        q = 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                q = 0.0
        if coding in ("gzip", "deflate") and q > 0 and (best is None or q > best[0]):
            best = (q, coding)
    return best[1] if best else None


def compress(body: bytes, coding: str) -> bytes:
    return gzip.compress(body, compresslevel=6) if coding == "gzip" else zlib.compress(body, 6)


# --- tensors ------------------------------------------------------------------------


def serialize_bytes(array: Array) -> bytes:
    """A BYTES tensor as the binary extension carries it: a length prefix per element."""
    parts: list[bytes] = []
    for item in array.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode()
        parts += [_LENGTH.pack(len(data)), data]
    return b"".join(parts)


def deserialize_bytes(data: memoryview, count: int, name: str) -> Array:
    """``count`` length-prefixed elements filling ``data`` exactly; BadRequest otherwise."""
    if count * _LENGTH.size > len(data):  # before allocating: each element sends 4 bytes
        raise BadRequest(
            f"input '{name}': {count} BYTES elements need at least {count * _LENGTH.size} "
            f"bytes of data, binary_data_size is {len(data)}"
        )
    out = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if offset + 4 > len(data):
            raise BadRequest(f"input '{name}': BYTES data ends inside element {i}'s length")
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += 4
        if offset + length > len(data):
            raise BadRequest(f"input '{name}': BYTES element {i} runs past its data")
        out[i] = bytes(data[offset : offset + length])
        offset += length
    if offset != len(data):
        raise BadRequest(f"input '{name}': {len(data) - offset} bytes left after {count} elements")
    return out


def _shape(raw: Any, name: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw
    ):
        raise BadRequest(f"input '{name}': 'shape' must be a list of non-negative integers")
    return tuple(raw)


def _parameters(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BadRequest(f"{where}: 'parameters' must be an object")
    for key, why in _UNSUPPORTED_PARAMETERS.items():
        if raw.get(key) not in (None, 0, ""):
            raise BadRequest(f"{where}: {why}")
    return raw


def _decode_input(
    entry: Any, binary: memoryview, offset: int, spec: TensorSpec | None, limits: TensorLimits
) -> tuple[str, Array, int]:
    """One entry of ``inputs``; returns its name, array and the new offset into ``binary``."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise BadRequest("each of 'inputs' must be an object with a string 'name'")
    name = entry["name"]
    datatype = entry.get("datatype")
    if not isinstance(datatype, str) or datatype not in DTYPE_OF_DATATYPE:
        raise BadRequest(
            f"input '{name}': datatype {datatype!r} is not one of {sorted(DTYPE_OF_DATATYPE)}"
        )
    dtype_name = DTYPE_OF_DATATYPE[datatype]
    if spec is not None and spec.dtype != dtype_name:
        raise InvalidInput(
            f"input '{name}': expected datatype {OIP_DATATYPES[spec.dtype]}, got {datatype}",
            input=name,
        )
    shape = _shape(entry.get("shape"), name)
    check_shape(name, shape, limits)  # before anything is sized by it
    if spec is not None and not spec.matches_shape(shape):
        raise InvalidInput(
            f"input '{name}': expected shape {list(spec.shape)}, got {list(shape)}", input=name
        )
    count = math.prod(shape)
    parameters = _parameters(entry.get("parameters"), f"input '{name}'")
    size = parameters.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadRequest(f"input '{name}': binary_data_size must be a non-negative integer")
        if "data" in entry:
            raise BadRequest(f"input '{name}': has both 'data' and binary_data_size")
        if offset + size > len(binary):
            raise BadRequest(
                f"input '{name}': binary_data_size {size} runs past the body "
                f"({len(binary) - offset} bytes left)"
            )
        chunk = binary[offset : offset + size]
        if dtype_name == "bytes":
            array = deserialize_bytes(chunk, count, name).reshape(shape)
        else:
            dtype = numpy_dtype(dtype_name)
            if size != count * dtype.itemsize:
                raise BadRequest(
                    f"input '{name}': {datatype} of shape {list(shape)} needs "
                    f"{count * dtype.itemsize} bytes, binary_data_size is {size}"
                )
            array = np.frombuffer(chunk, dtype=dtype.newbyteorder("<")).reshape(shape)
        return name, array, offset + size
    if "data" not in entry:
        raise BadRequest(f"input '{name}': needs 'data' or parameters.binary_data_size")
    return name, _json_tensor(name, entry["data"], dtype_name, shape), offset


def _json_tensor(name: str, data: Any, dtype_name: str, shape: tuple[int, ...]) -> Array:
    """JSON ``data``, nested or flat row-major, as an array of ``shape``."""
    if not isinstance(data, list):
        data = [data]
    flat: Array
    if dtype_name == "bytes":  # np.asarray would make fixed-width strings, or ragged objects
        values = _flatten(data)
        flat = np.empty(len(values), dtype=object)
        flat[:] = values
    else:
        try:
            flat = np.asarray(data).reshape(-1)
        except ValueError:
            raise BadRequest(f"input '{name}': 'data' is not a rectangular array") from None
    if flat.size != math.prod(shape):
        raise BadRequest(
            f"input '{name}': shape {list(shape)} holds {math.prod(shape)} elements, "
            f"'data' has {flat.size}"
        )
    return from_plain(name, flat.reshape(shape), TensorSpec(dtype_name, shape))


def _flatten(data: list[Any]) -> list[Any]:
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _requested_outputs(raw: Any) -> tuple[RequestedOutput, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise BadRequest("'outputs' must be a list")
    out = []
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise BadRequest("each of 'outputs' must be an object with a string 'name'")
        parameters = _parameters(entry.get("parameters"), f"output '{entry['name']}'")
        binary = parameters.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise BadRequest(f"output '{entry['name']}': binary_data must be true or false")
        out.append(RequestedOutput(entry["name"], binary))
    return tuple(out)


def _priority(value: Any) -> Priority | None:
    """Triton's numbering: 0 the model's default, 1 the highest, larger values lower."""
    if value is None or value == 0:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest("parameters.priority must be a non-negative integer")
    return Priority.HIGH if value == 1 else Priority.NORMAL if value == 2 else Priority.LOW


def _timeout_s(value: Any) -> float | None:
    """Triton's ``timeout`` parameter is in microseconds."""
    if value is None or value == 0:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise BadRequest("parameters.timeout must be a number of microseconds >= 0")
    return float(value) / 1e6


def parse_header_length(text: str | None, body_bytes: int) -> int | None:
    if text is None:
        return None
    try:
        length = int(text)
    except ValueError:
        raise BadRequest(f"Inference-Header-Content-Length {text!r} is not a number") from None
    if not 0 <= length <= body_bytes:
        raise BadRequest(
            f"Inference-Header-Content-Length {length} is outside the body of {body_bytes} bytes"
        )
    return length


#: Why the JSON part of an infer request has a lower limit than the whole body.
JSON_PART_HINT = (
    "the JSON part has a lower limit (--max-json-body-bytes): send large tensors "
    "with the binary data extension (binary_data_size)"
)


def decode_request(
    body: bytes,
    header_length: int | None,
    specs: Mapping[str, TensorSpec],
    limits: TensorLimits = DEFAULT_LIMITS,
    json_limit_bytes: int | None = None,
) -> InferRequest:
    """Parse an infer request body; BadRequest (or InvalidInput) names what is wrong,
    TensorTooLarge a shape past ``limits``, PayloadTooLarge a JSON part past
    ``json_limit_bytes``."""
    view = memoryview(body)
    json_part = view if header_length is None else view[:header_length]
    binary = view[len(json_part) :]
    if json_limit_bytes is not None and len(json_part) > json_limit_bytes:
        raise PayloadTooLarge(json_limit_bytes, JSON_PART_HINT)
    try:
        header = orjson.loads(json_part)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"infer request header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise BadRequest("infer request must be a JSON object")
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest("'id' must be a string")
    parameters = _parameters(header.get("parameters"), "request")
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("'inputs' must be a non-empty list")
    for entry in raw_inputs:  # malformed anywhere is a 400 before any limit is a 413
        if isinstance(entry, dict):
            _shape(entry.get("shape"), str(entry.get("name")))
    inputs: dict[str, Array] = {}
    offset = 0
    for entry in raw_inputs:
        spec = specs.get(str(entry.get("name"))) if isinstance(entry, dict) else None
        name, array, offset = _decode_input(entry, binary, offset, spec, limits)
        if name in inputs:
            raise BadRequest(f"input '{name}' is given twice")
        inputs[name] = array
    if offset != len(binary):
        raise BadRequest(
            f"the body has {len(binary) - offset} bytes after the tensors its header describes"
        )
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise BadRequest("parameters.binary_data_output must be true or false")
    return InferRequest(
        id=request_id,
        inputs=inputs,
        outputs=_requested_outputs(header.get("outputs")),
        binary_output=binary_output,
        priority=_priority(parameters.get("priority")),
        timeout_s=_timeout_s(parameters.get("timeout")),
    )


def datatype_of(array: Array, spec: TensorSpec | None) -> str:
    name = spec.dtype if spec is not None else name_of(array.dtype)
    if name is None:
        raise FnrtError(f"an output of dtype {array.dtype} has no Open Inference Protocol type")
    return OIP_DATATYPES[name]


def _json_data(name: str, array: Array, datatype: str) -> list[Any]:
    flat = array.reshape(-1)
    if datatype != "BYTES":
        check_json_numbers(name, flat)
        return flat.tolist()
    try:
        return [item.decode("utf-8") for item in flat]
    except UnicodeDecodeError:
        raise NotJsonText(next(i for i in flat if not _utf8(i))) from None


def _utf8(item: bytes) -> bool:
    try:
        item.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def encode_response(
    model: str,
    version: str,
    request: InferRequest,
    outputs: Mapping[str, Array],
    specs: Mapping[str, TensorSpec],
    limits: TensorLimits = DEFAULT_LIMITS,
) -> tuple[bytes, int | None]:
    """The response body and, when binary outputs follow the JSON, the JSON's length.
    ResponseTooLarge, before encoding, past ``limits.max_response_bytes``."""
    if request.outputs is None:
        chosen: Sequence[RequestedOutput] = [RequestedOutput(n, None) for n in outputs]
    else:
        chosen = request.outputs
        unknown = [o.name for o in chosen if o.name not in outputs]
        if unknown:
            raise BadRequest(
                f"output '{unknown[0]}' is not an output of '{model}' "
                f"(outputs: {', '.join(outputs)})"
            )
    estimate = 0
    for wanted in chosen:
        array = outputs[wanted.name]
        binary = wanted.binary if wanted.binary is not None else request.binary_output
        estimate += packed_bytes(array) if binary else json_bytes(array)
    if estimate > limits.max_response_bytes:
        raise ResponseTooLarge(
            estimate,
            limits.max_response_bytes,
            "ask for binary outputs (binary_data_output), or send less",
        )
    entries: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for wanted in chosen:
        array = outputs[wanted.name]
        datatype = datatype_of(array, specs.get(wanted.name))
        entry: dict[str, Any] = {
            "name": wanted.name,
            "datatype": datatype,
            "shape": list(array.shape),
        }
        if wanted.binary if wanted.binary is not None else request.binary_output:
            if datatype == "BYTES":
                raw = serialize_bytes(array)
            else:
                little = array.astype(array.dtype.newbyteorder("<"), copy=False)
                raw = np.ascontiguousarray(little).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = _json_data(wanted.name, array, datatype)
        entries.append(entry)
    header: dict[str, Any] = {"model_name": model, "model_version": version}
    if request.id is not None:
        header["id"] = request.id
    header["outputs"] = entries
    json_part = orjson.dumps(header)
    if not blobs:
        return json_part, None
    return b"".join([json_part, *blobs]), len(json_part)
