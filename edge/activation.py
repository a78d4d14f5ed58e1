"""The activation a device sends at a split point, and how it is compressed.

The body of ``POST /v1/functions/{name}/split/{k}`` is a msgpack map (the
tensor codec of :mod:`fnrt.functions.codec`)::

    {"activation": <ndarray>}                  # float32 as computed, or float16
    {"activation": <int8 ndarray>, "scale": s}  # int8: value = q * s

``int8`` is symmetric per tensor (``s = max|a| / 127``): a quarter of the bytes
of float32, error at most ``s / 2`` per element; ``float16`` halves the bytes
with a relative error near 1e-3.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from fnrt.functions.errors import BadRequest, FnrtError, InvalidInput

if TYPE_CHECKING:
    from fnrt.functions.limits import TensorLimits

Array = np.ndarray[Any, Any]


class Encoding(Enum):
    """How an activation crosses the network."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    INT8 = "int8"

    @property
    def item_bytes(self) -> int:
        return {"float32": 4, "float16": 2, "int8": 1}[self.value]

    @staticmethod
    def parse(text: str) -> Encoding:
        try:
            return Encoding(text)
        except ValueError:
            raise ValueError(
                f"encoding must be one of {[e.value for e in Encoding]}, got {text!r}"
            ) from None


def pack(activation: Array, encoding: Encoding = Encoding.FLOAT32) -> bytes:
    """The request body carrying ``activation`` as ``encoding``; an integer or bool one
    (a model's own input, at split 0: token ids, say) travels as it is, whatever the
    encoding (rounded or quantised, its values would change)."""
    if activation.dtype.kind in "biu":
        return _packb({"activation": _array(activation)})
    if encoding is Encoding.INT8:
        peak = float(np.max(np.abs(activation))) if activation.size else 0.0
        scale = peak / 127.0 if peak > 0 else 1.0
        quantised = np.clip(np.rint(activation / scale), -127, 127).astype(np.int8)
        return _packb({"activation": _array(quantised), "scale": scale})
    if encoding is Encoding.FLOAT16:
        return _packb({"activation": _array(activation.astype(np.float16))})
    return _packb({"activation": _array(activation.astype(np.float32, copy=False))})


# The edge client packs and reads bodies with msgpack alone (no fnrt.functions.codec,
# whose JSON and bfloat16 support need orjson and ml_dtypes): arrays in the same
# msgpack_numpy layout, numeric dtypes only.


def _array(array: Array) -> dict[str, Any]:
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return {
        "nd": True,
        "type": array.dtype.str,
        "kind": b"",
        "shape": list(array.shape),
        "data": array.tobytes(),
    }


def _packb(payload: Mapping[str, Any]) -> bytes:
    return msgpack.packb(payload, use_bin_type=True)  # type: ignore[no-any-return]


def read_outputs(body: bytes) -> dict[str, Array]:
    """The outputs in an answer (msgpack, numeric arrays); FnrtError if malformed."""
    try:
        payload = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:
        raise FnrtError(f"the server's answer is not msgpack: {exc}") from None
    if not isinstance(payload, dict):
        raise FnrtError("the server's answer is not a map of outputs")
    out = {}
    for name, value in payload.items():
        if isinstance(value, dict):
            value = {k.decode() if isinstance(k, bytes) else k: v for k, v in value.items()}
        if not (isinstance(value, dict) and value.get("nd") is True):
            raise FnrtError(f"output {name!r} is not an array")
        kind = value.get("type")
        dtype = np.dtype(kind.decode() if isinstance(kind, bytes) else kind)
        if dtype.kind not in "biuf":
            raise FnrtError(f"output {name!r} has dtype {dtype}, not a numeric one")
        out[str(name)] = np.frombuffer(value["data"], dtype=dtype).reshape(value["shape"])
    return out


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def unpack(body: bytes, limits: TensorLimits | None = None) -> Array:
    """The activation a request body carries: float32 (from float32, float16 or int8
    with its scale), or an integer or bool one as it came (a model's own input at split
    0); BadRequest or InvalidInput if not (TensorTooLarge past ``limits``)."""
    from fnrt.functions.codec import decode_msgpack  # the server's validating decoder
    from fnrt.functions.limits import DEFAULT_LIMITS

    payload: Mapping[str, Any] = decode_msgpack(body, limits or DEFAULT_LIMITS)
    activation = payload.get("activation")
    if not isinstance(activation, np.ndarray):
        raise BadRequest("the body must be a msgpack map with an 'activation' array")
    extra = set(payload) - {"activation", "scale"}
    if extra:
        raise BadRequest(f"unknown keys in the body: {sorted(extra)}")
    if activation.dtype == np.int8:
        scale = payload.get("scale")
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not scale > 0:
            raise InvalidInput("an int8 activation needs a 'scale' > 0", input="scale")
        if not scale <= _FLOAT32_MAX:  # as it is applied: past float32's largest, inf
            raise InvalidInput("'scale' must be finite (as a float32)", input="scale")
        return activation.astype(np.float32) * np.float32(scale)
    if "scale" in payload:
        raise InvalidInput("'scale' goes only with an int8 activation", input="scale")
    if activation.dtype == np.float16:
        return activation.astype(np.float32)
    if activation.dtype == np.float32 or activation.dtype.kind in "biu":
        return activation
    raise InvalidInput(
        f"activation must be float32, float16, int8 (with a scale), or the integer or bool "
        f"dtype of a model's input, got {activation.dtype}",
        input="activation",
    )
