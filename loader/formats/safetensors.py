"""safetensors files mapped, not read: tensors are views of the mapped file.

The file is mapped copy-on-write, so the pages come from the page cache (and
are shared between processes) until someone writes to a tensor, which then
gets a private copy of just that page.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from fnrt.functions.errors import FnrtError
from fnrt.functions.extras import require

_NUMPY_DTYPES = {
    "BOOL": np.bool_,
    "U8": np.uint8,
    "I8": np.int8,
    "U16": np.uint16,
    "I16": np.int16,
    "U32": np.uint32,
    "I32": np.int32,
    "U64": np.uint64,
    "I64": np.int64,
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "BF16": np.uint16,  # reinterpreted as bfloat16 for torch
}
_MAX_HEADER = 100 * 1024 * 1024


def read_header(path: Path) -> tuple[int, dict[str, Any]]:
    """The byte offset where tensor data starts, and the parsed JSON header."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise FnrtError(f"{path} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw)
        if length > _MAX_HEADER:
            raise FnrtError(f"{path} is not a safetensors file (header of {length} bytes)")
        try:
            header: dict[str, Any] = json.loads(f.read(length))
        except ValueError:
            raise FnrtError(f"{path} is not a safetensors file (header is not JSON)") from None
    header.pop("__metadata__", None)
    return 8 + length, header


def arrays(path: Path, *, writable: bool = False) -> dict[str, np.ndarray[Any, Any]]:
    """Every tensor as a numpy view of the mapped file (BF16 as raw uint16)."""
    start, header = read_header(path)
    mapped = np.memmap(path, mode="c" if writable else "r", dtype=np.uint8)
    out: dict[str, np.ndarray[Any, Any]] = {}
    for name, info in header.items():
        dtype = _NUMPY_DTYPES.get(info["dtype"])
        if dtype is None:
            raise FnrtError(f"{path}: tensor '{name}' has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        view: np.ndarray[Any, Any] = mapped[start + begin : start + end].view(dtype)
        out[name] = view.reshape(info["shape"])
    return out


def tensors(path: Path, device: str = "cpu") -> dict[str, Any]:
    """Every tensor as a ``torch.Tensor`` sharing memory with the mapped file.

    On ``cpu`` nothing is copied; on a GPU each tensor is copied once to the device.
    """
    torch = require("torch", "safetensors as torch tensors")

    _, header = read_header(path)
    out: dict[str, Any] = {}
    for name, array in arrays(path, writable=True).items():
        tensor = torch.from_numpy(array)
        if header[name]["dtype"] == "BF16":
            tensor = tensor.view(torch.bfloat16)
        out[name] = tensor if device == "cpu" else tensor.to(device, non_blocking=True)
    return out


_DTYPE_NAMES = {np.dtype(v).str: k for k, v in _NUMPY_DTYPES.items() if k != "BF16"}


def save_arrays(arrays: dict[str, np.ndarray[Any, Any]], path: Path) -> None:
    """Write numpy arrays as a safetensors file (readable by the ``safetensors`` package)."""
    header: dict[str, Any] = {}
    offset = 0
    ordered = sorted(arrays.items())
    for name, array in ordered:
        array = np.ascontiguousarray(array)
        key = array.dtype.newbyteorder("<").str if array.dtype.byteorder == ">" else array.dtype.str
        if key not in _DTYPE_NAMES:
            raise FnrtError(f"tensor '{name}': dtype {array.dtype} has no safetensors name")
        header[name] = {
            "dtype": _DTYPE_NAMES[key],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, array in ordered:
            f.write(np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes())
