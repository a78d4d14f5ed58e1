"""The tensor wire codec for ``/v1`` bodies: msgpack and JSON.

msgpack bodies carry arrays the way ``msgpack_numpy`` encodes them (a map with
the keys ``nd``, ``type``, ``kind``, ``shape``, ``data``), so a client that
packs with ``msgpack_numpy`` works unchanged; arrays are decoded with
``numpy.frombuffer`` over the received bytes, without another copy. Object and
structured dtypes (which ``msgpack_numpy`` would unpickle) are refused.

JSON bodies carry arrays as nested lists. Both decoders return a mapping of
name to value; :mod:`fnrt.functions.tensors` checks it against the manifest.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from enum import Enum
from typing import Any, Protocol

import msgpack
import numpy as np
import orjson

from fnrt.functions.dtypes import BFLOAT16, OBJECT, is_numeric
from fnrt.functions.errors import (
    BadOutput,
    BadRequest,
    FnrtError,
    TensorTooLarge,
    UnsupportedMediaType,
)
from fnrt.functions.limits import DEFAULT_LIMITS, TensorLimits, check_response, check_shape
from fnrt.functions.numbers import marked


class Format(Enum):
    """A body format and its media type."""

    JSON = "application/json"
    MSGPACK = "application/msgpack"

    @property
    def media_type(self) -> str:
        media_type: str = self._value_  # (``value`` is a descriptor: dearer, on every answer)
        return media_type


_MEDIA_TYPES = {
    "application/json": Format.JSON,
    "application/msgpack": Format.MSGPACK,
    "application/x-msgpack": Format.MSGPACK,
    "application/vnd.msgpack": Format.MSGPACK,
}


def format_of(content_type: str | None, *, default: Format = Format.JSON) -> Format:
    """The format a ``Content-Type`` header names (parameters ignored)."""
    if not content_type:
        return default
    found = _MEDIA_TYPES.get(content_type)  # the usual header: the bare media type
    if found is not None:
        return found
    media = content_type.split(";", 1)[0].strip().lower()
    if media in _MEDIA_TYPES:
        return _MEDIA_TYPES[media]
    raise UnsupportedMediaType(
        f"unsupported Content-Type {media!r}: use application/json or application/msgpack"
    )


def negotiate(accept: str | None, request_format: Format) -> Format:
    """The response format: the first type ``Accept`` names that fnrt speaks.

    No ``Accept``, or ``*/*``, answers in the request's own format.
    """
    if not accept:
        return request_format
    for part in accept.split(","):
        media = part.split(";", 1)[0].strip().lower()
        if media in ("*/*", "application/*", ""):
            return request_format
        if media in _MEDIA_TYPES:
            return _MEDIA_TYPES[media]
    raise UnsupportedMediaType(
        f"cannot answer in {accept!r}: use application/json or application/msgpack", accept=accept
    )


# --- msgpack -----------------------------------------------------------------

_ND, _TYPE, _SHAPE, _DATA, _KIND = b"nd", b"type", b"shape", b"data", b"kind"


def _field(obj: Mapping[Any, Any], key: bytes) -> Any:
    if key in obj:
        return obj[key]
    return obj.get(key.decode())


#: Numeric dtypes by the type string a client sent (``type``), each checked once: the
#: same few strings come in every body. Bounded: strings are the client's.
_DTYPES: dict[Any, np.dtype[Any]] = {}
_DTYPES_KEPT = 256
_DIM_TYPES = frozenset((int, bool))  # what isinstance(d, int) accepts
_BUFFERS = (bytes, bytearray, memoryview)
_SEQUENCES = (list, tuple)


def _numeric_dtype(descr: Any) -> np.dtype[Any]:
    """The numeric dtype ``descr`` names; BadRequest for any other."""
    text = descr.decode("ascii", "replace") if isinstance(descr, bytes) else descr
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError):
        raise BadRequest(f"array has an unknown dtype {text!r}") from None
    if not is_numeric(dtype) or dtype.fields is not None:
        raise BadRequest(f"array dtype {text!r} is not a numeric dtype")
    if isinstance(descr, bytes | str) and len(_DTYPES) < _DTYPES_KEPT:
        _DTYPES[descr] = dtype
    return dtype


def _decode_array(obj: Mapping[Any, Any], limits: TensorLimits) -> np.ndarray[Any, Any]:
    try:  # the usual map: msgpack_numpy's bytes keys, all there
        kind, descr, data, shape, nd = obj[_KIND], obj[_TYPE], obj[_DATA], obj[_SHAPE], obj[_ND]
    except KeyError:  # keys as str, or some missing
        kind, descr = _field(obj, _KIND), _field(obj, _TYPE)
        data, shape, nd = _field(obj, _DATA), _field(obj, _SHAPE), _field(obj, _ND)
    if kind not in (None, b"", ""):
        raise BadRequest("arrays of object or structured dtype are not accepted")
    try:
        dtype = _DTYPES[descr]
    except (KeyError, TypeError):  # not seen yet (or unhashable: refused there)
        dtype = _numeric_dtype(descr)
    if not isinstance(data, _BUFFERS):
        raise BadRequest("array 'data' must be raw bytes")
    if not isinstance(shape, _SEQUENCES) or not (
        not shape or (set(map(type, shape)) <= _DIM_TYPES and min(shape) >= 0)
    ):
        raise BadRequest("array 'shape' must be a list of non-negative integers")
    count = math.prod(shape)
    if not 0 < count <= limits.max_elements or len(shape) > limits.max_dims:
        check_shape(None, shape, limits)  # a 0 in it, or past a limit: before any sizing
    if nd is not True:  # a numpy scalar
        if len(data) != dtype.itemsize:
            raise BadRequest("scalar data does not match its dtype's size")
        return np.frombuffer(data, dtype=dtype).reshape(())
    if count * dtype.itemsize != len(data):
        raise BadRequest(
            f"array of shape {list(shape)} and dtype {dtype.str} needs "
            f"{count * dtype.itemsize} bytes, got {len(data)}"
        )
    array = np.frombuffer(data, dtype=dtype).reshape(shape)
    if dtype.byteorder == ">":
        array = array.astype(dtype.newbyteorder("<"))
    return array


def _hook(limits: TensorLimits) -> Any:
    def hook(obj: dict[Any, Any]) -> Any:
        if _ND in obj or "nd" in obj:
            return _decode_array(obj, limits)
        return obj

    return hook


_DEFAULT_HOOK = _hook(DEFAULT_LIMITS)
#: The limits a body was last decoded under, and their hook (a server decodes every body
#: under the same limits: one closure, not one a body). Swapped whole: thread-safe.
_last_hook: tuple[TensorLimits, Any] = (DEFAULT_LIMITS, _DEFAULT_HOOK)


def encode_array(array: np.ndarray[Any, Any]) -> dict[bytes, Any]:
    """An array in the ``msgpack_numpy`` layout (little-endian, C order).

    bfloat16 goes as type ``"bfloat16"`` (numpy has no type string for it;
    ``numpy.dtype("bfloat16")`` reads it once ``ml_dtypes`` is imported).
    """
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    if not array.flags.c_contiguous:  # (ascontiguousarray would make a 0-d array 1-d)
        array = np.ascontiguousarray(array)
    type_name = array.dtype.str
    if array.dtype == BFLOAT16:
        type_name, array = "bfloat16", array.view(np.uint16)
    return {
        _ND: True,
        _TYPE: type_name,
        _KIND: b"",
        _SHAPE: list(array.shape),
        _DATA: array.data.cast("B") if array.size else b"",
    }


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype == OBJECT:  # bytes elements: nested lists of msgpack bin
            return obj.tolist()
        return encode_array(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__} as msgpack")


def decode_msgpack(body: bytes, limits: TensorLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """A msgpack body as ``{name: value}``; raises BadRequest when malformed, and
    TensorTooLarge for an array whose shape is past ``limits``."""
    global _last_hook
    known, hook = _last_hook
    if known is not limits:
        hook = _hook(limits)
        _last_hook = (limits, hook)
    try:
        obj = msgpack.unpackb(body, object_hook=hook, raw=False, strict_map_key=False)
    except TensorTooLarge as exc:
        raise _named(body, limits) or exc from None
    except FnrtError:
        raise
    except Exception as exc:
        raise BadRequest(f"body is not valid msgpack: {_why(exc)}") from None
    return _top_level(obj)


def _why(exc: Exception) -> str:
    """What msgpack said was wrong; some of its errors say nothing (a body nested too
    deep raises a bare StackError)."""
    if isinstance(exc, msgpack.StackError):
        return "nested too deep"
    return str(exc) or type(exc).__name__


class _Refused:
    """An array map past the limits, held in place of the array while a refused body is
    read again to find the input that holds it."""

    def __init__(self, error: TensorTooLarge, shape: list[int]) -> None:
        self.error, self.shape = error, shape


def _named(body: bytes, limits: TensorLimits) -> TensorTooLarge | None:
    """The TensorTooLarge of ``body``'s first array past ``limits``, naming its input.

    msgpack decodes an array's map before the map that names it, so the first pass
    refuses it nameless; this second pass (a refused body only, no array allocated)
    keeps each refusal in place and looks for it under the top-level keys."""

    def hook(obj: dict[Any, Any]) -> Any:
        if _ND in obj or "nd" in obj:
            shape = _field(obj, _SHAPE)
            if not isinstance(shape, list | tuple):
                return None
            try:
                check_shape(None, shape, limits)
            except TensorTooLarge as exc:
                return _Refused(exc, list(shape))
            return None  # within the limits: not needed to name the refused one
        return obj

    try:
        obj = msgpack.unpackb(body, object_hook=hook, raw=False, strict_map_key=False)
    except Exception:
        return None
    if not isinstance(obj, dict):
        return None
    for name, value in obj.items():
        found = _find_refused(value)
        if found is not None:
            try:
                check_shape(str(name), found.shape, limits)
            except TensorTooLarge as exc:
                return exc
    return None


def _find_refused(value: Any) -> _Refused | None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Refused):
            return item
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return None


class Readable(Protocol):
    """What msgpack's unpacker reads from: a file, or bytes arriving in pieces."""

    def read(self, size: int = -1, /) -> bytes: ...


def iter_msgpack(
    stream: Readable, limits: TensorLimits = DEFAULT_LIMITS, max_object_bytes: int = 64 << 20
) -> Iterator[dict[str, Any]]:
    """The maps of a msgpack stream (one after another, as ``msgpack.Packer`` writes
    them), each checked as :func:`decode_msgpack` checks a body; BadRequest when one
    is malformed or is not a map (``MalformedAt.index`` says which)."""
    unpacker = msgpack.Unpacker(
        stream,
        object_hook=_hook(limits),
        raw=False,
        strict_map_key=False,
        max_buffer_size=max_object_bytes,
    )
    index = 0
    while True:
        try:
            obj = unpacker.unpack()
        except msgpack.OutOfData:
            return
        except FnrtError as exc:
            raise MalformedAt(index, exc.message) from None
        except Exception as exc:
            raise MalformedAt(index, f"not valid msgpack: {_why(exc)}") from None
        try:
            yield _top_level(obj)
        except BadRequest as exc:
            raise MalformedAt(index, exc.message) from None
        index += 1


class MalformedAt(BadRequest):
    """The ``index``-th object of a msgpack stream is malformed."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason


def encode_msgpack(payload: Mapping[str, Any]) -> bytes:
    """Encode a mapping whose values may be numpy arrays."""
    fast = _encode_arrays(payload)
    if fast is not None:
        return fast
    return msgpack.packb(payload, default=_default, use_bin_type=True)  # type: ignore[no-any-return]


#: A packed array map less its data, by (dtype, shape): every answer of one output of a
#: version has the same; and output names packed. Each cleared when it holds _KEPT.
_ARRAY_HEADS: dict[tuple[np.dtype[Any], tuple[int, ...]], bytes] = {}
_PACKED_NAMES: dict[str, bytes] = {}
_KEPT = 1024


def _array_head(array: np.ndarray[Any, Any]) -> bytes | None:
    """``array``'s packed map less its data; None for an array packed the general way
    (big-endian or of objects)."""
    dtype = array.dtype
    if dtype.byteorder == ">" or dtype.hasobject:
        return None
    packed: bytes = msgpack.packb(encode_array(array), use_bin_type=True)
    head = packed[: len(packed) - array.nbytes]  # ``data`` is the map's last value
    if len(_ARRAY_HEADS) >= _KEPT:
        _ARRAY_HEADS.clear()
    _ARRAY_HEADS[dtype, array.shape] = head
    return head


def _encode_arrays(payload: Mapping[str, Any]) -> bytes | None:
    """What ``msgpack.packb`` makes of ``payload``, byte for byte, when it is a map of up
    to 15 names to numeric arrays laid out as they travel (C order, little-endian or
    one byte): each array's packed map less its data made once per dtype and shape, its
    data joined as it lies. None for anything else (packed the general way)."""
    if type(payload) is not dict or len(payload) > 15:
        return None
    parts: list[Any] = [_FIXMAPS[len(payload)]]
    for name, value in payload.items():
        if type(value) is not np.ndarray or type(name) is not str or not value.flags.c_contiguous:
            return None
        head = _ARRAY_HEADS.get((value.dtype, value.shape)) or _array_head(value)
        if head is None:
            return None
        packed_name = _PACKED_NAMES.get(name)
        if packed_name is None:
            if len(_PACKED_NAMES) >= _KEPT:  # an echo's names are its clients'
                _PACKED_NAMES.clear()
            packed_name = _PACKED_NAMES[name] = msgpack.packb(name, use_bin_type=True)
        parts += (packed_name, head, value)  # the array's buffer, as it lies
    return b"".join(parts)


_FIXMAPS = [bytes([0x80 | n]) for n in range(16)]


# --- JSON --------------------------------------------------------------------

_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic):
        return obj.tolist()
    if isinstance(obj, bytes):  # elements of a bytes tensor
        try:
            return obj.decode("utf-8")
        except UnicodeDecodeError:
            raise NotJsonText(obj) from None
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


class NotJsonText(BadRequest):
    """A bytes element that is not UTF-8 text cannot travel in JSON."""

    def __init__(self, value: bytes) -> None:
        super().__init__(
            f"an output holds bytes that are not UTF-8 text ({value[:16]!r}...); "
            "ask for msgpack (or binary data on /v2)"
        )


class NotJsonNumber(BadOutput):
    """NaN and the infinities cannot travel in JSON: it has no literal for them. An
    output that holds them is the function's doing (weights gone bad, a division by
    zero), not the request's: a server error (500)."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"output '{name}' holds NaN or infinite values, which JSON cannot carry; "
            "ask for msgpack (or binary data on /v2)",
            output=name,
        )


def check_json_numbers(name: str, value: Any) -> None:
    """Raise NotJsonNumber if ``value`` is a float array holding NaN or an infinity
    (orjson would write them as ``null`` without a word)."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "fV" and value.size:
        try:
            finite = bool(np.isfinite(value).all())
        except TypeError:  # a structured or void dtype: not numbers
            return
        if not finite:
            raise NotJsonNumber(name)


def decode_json(body: bytes) -> dict[str, Any]:
    """A JSON body as ``{name: nested lists}`` (``numbers.Numbers`` when no value holds
    a string); raises BadRequest when malformed."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    return marked(body, _top_level(obj))


def encode_json(payload: Any) -> bytes:
    """Encode plain data or numpy arrays as compact JSON; NotJsonNumber for an array
    holding NaN or an infinity, NotJsonText for bytes that are not UTF-8."""
    try:
        try:
            out = orjson.dumps(payload, default=_json_default, option=_JSON_OPTIONS)
        except TypeError as exc:
            if isinstance(exc.__cause__, NotJsonText) or not isinstance(payload, Mapping):
                raise
            # orjson serialises native-endian, C-contiguous arrays itself and refuses
            # others without asking ``default``: give it plain lists for those.
            plain = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in payload.items()}
            out = orjson.dumps(plain, default=_json_default)
    except TypeError as exc:
        if isinstance(exc.__cause__, NotJsonText):
            raise exc.__cause__ from None
        raise
    # orjson writes NaN and the infinities as null. Without a null in the answer no
    # array held one, and no array is looked over: the usual answer costs a search.
    if b"null" in out and isinstance(payload, Mapping):
        for name, value in payload.items():
            check_json_numbers(str(name), value)
    return out


def _top_level(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise BadRequest(f"body must be a map of input name to tensor, got {type(obj).__name__}")
    for key in obj:
        if not isinstance(key, str):
            raise BadRequest(f"input names must be strings, got {key!r}")
    return obj


def decode(body: bytes, fmt: Format, limits: TensorLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """A body in ``fmt`` as ``{name: value}``; TensorTooLarge, naming the input, for an
    array past ``limits`` (a JSON input past ``max_elements``, or a msgpack array past
    either limit; JSON bodies are also bounded by their bytes)."""
    if fmt is not Format.JSON:
        return decode_msgpack(body, limits)
    inputs = decode_json(body)
    # each cell of nested lists takes at least a byte of JSON (a 0 dimension's ``[]``
    # two): only a body longer than the limit can hold an input past it, so the usual
    # request pays one comparison (a ragged list is refused when made an array)
    if len(body) > limits.max_elements:
        for name, value in inputs.items():
            if type(value) is list:
                check_shape(name, json_shape(value), limits)
    return inputs


def json_shape(value: list[Any]) -> list[int]:
    """The shape nested lists declare, read down their first elements (a ragged list
    is refused later, when it is made an array)."""
    shape = []
    item: Any = value
    while type(item) is list:
        shape.append(len(item))
        if not item:
            break
        item = item[0]
    return shape


def encode(payload: Mapping[str, Any], fmt: Format, limits: TensorLimits = DEFAULT_LIMITS) -> bytes:
    """``payload`` in ``fmt``; ResponseTooLarge, before encoding, if it would pass
    ``limits.max_response_bytes``."""
    if fmt is Format.JSON:
        check_response(payload, as_json=True, limits=limits, hint=_JSON_HINT)
        return encode_json(payload)
    check_response(payload, as_json=False, limits=limits, hint=_SMALLER_HINT)
    return encode_msgpack(payload)


_JSON_HINT = "ask for application/msgpack (binary tensors are far smaller), or send less"
_SMALLER_HINT = "send less per request"
