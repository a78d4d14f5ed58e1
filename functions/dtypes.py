"""The element types fnrt knows, by every name they go by.

A manifest names a dtype the numpy way (``float32``); the Open Inference
Protocol calls it ``FP32``. Two need more than plain numpy:

- ``bfloat16`` is ``ml_dtypes.bfloat16`` (what tritonclient and JAX use), a
  real numpy dtype with 2-byte elements;
- ``bytes`` is a numpy object array whose elements are ``bytes`` (strings
  arrive UTF-8 encoded), the way tritonclient hands BYTES tensors over.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

OBJECT: np.dtype[Any] = np.dtype(object)


@functools.cache
def _bfloat16() -> np.dtype[Any]:
    import ml_dtypes

    dtype: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
    return dtype


def __getattr__(name: str) -> Any:
    """``BFLOAT16`` (``ml_dtypes.bfloat16``), imported on first use: the edge client
    reads manifests on a device that has numpy but not ml_dtypes."""
    if name == "BFLOAT16":
        return _bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Manifest dtype name -> Open Inference Protocol datatype.
OIP_DATATYPES: Mapping[str, str] = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "bfloat16": "BF16",
    "bytes": "BYTES",
}
#: Open Inference Protocol datatype -> manifest dtype name.
DTYPE_OF_DATATYPE: Mapping[str, str] = {v: k for k, v in OIP_DATATYPES.items()}

#: Every dtype a manifest may declare.
DTYPES = frozenset(OIP_DATATYPES)


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype of a manifest dtype name (``bytes`` is ``object``)."""
    dtype = _BY_NAME.get(name)
    if dtype is not None:
        return dtype
    if name == "bytes":
        return OBJECT
    dtype = _bfloat16() if name == "bfloat16" else np.dtype(name)
    if name in DTYPES:  # the cache holds the few names a manifest can declare
        _BY_NAME[name] = dtype
    return dtype


#: numpy_dtype's answers, per manifest dtype name.
_BY_NAME: dict[str, np.dtype[Any]] = {}


#: name_of's answers, per dtype (a few: the dtypes fnrt knows, in either byte order).
_NAMES: dict[np.dtype[Any], str | None] = {}


def name_of(dtype: np.dtype[Any]) -> str | None:
    """The manifest name of a numpy dtype, or None when fnrt has no name for it."""
    try:
        return _NAMES[dtype]
    except KeyError:
        pass
    if dtype == _bfloat16():
        name: str | None = "bfloat16"
    elif dtype == OBJECT:
        name = "bytes"
    else:
        name = dtype.name if dtype.name in DTYPES else None
    if name is not None and len(_NAMES) < 64:  # only known names: the cache stays small
        _NAMES[dtype] = name
    return name


def is_numeric(dtype: np.dtype[Any]) -> bool:
    """Fixed-size elements that travel as raw little-endian bytes (not BYTES)."""
    return dtype.kind in "biuf" or dtype == _bfloat16()


def bytes_array(value: Any) -> np.ndarray[Any, Any]:
    """Nested lists (or an array) of ``str``/``bytes`` as an object array of ``bytes``.

    Raises ValueError when an element is something else or the lists are ragged.
    """
    array = value if isinstance(value, np.ndarray) else np.array(value, dtype=object)
    if array.dtype.kind in "US":  # fixed-width numpy strings
        array = array.astype(object)
    if array.dtype != OBJECT:
        raise ValueError(f"expected strings or bytes, got {array.dtype.name} values")
    out = np.empty(array.shape, dtype=object)
    flat_in, flat_out = array.reshape(-1), out.reshape(-1)
    for i, item in enumerate(flat_in):
        if isinstance(item, bytes):
            flat_out[i] = item
        elif isinstance(item, str):
            flat_out[i] = item.encode("utf-8")
        elif isinstance(item, bytearray | memoryview | np.bytes_):
            flat_out[i] = bytes(item)
        elif isinstance(item, list | tuple):
            raise ValueError("not a rectangular array")
        else:
            raise ValueError(f"expected strings or bytes, got {type(item).__name__}")
    return out
