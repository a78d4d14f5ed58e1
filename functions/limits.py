"""Bounds on what a request can make the server do: tensor shapes and response sizes.

A few bytes can declare a huge shape. A msgpack array of shape
``[134217728, 0]`` has no data, so it passes every size check, yet written
back as JSON it is 134 million empty lists (400 MB, 47 s of a held GIL). An
OIP BYTES input of shape ``[268435456]`` asks for an object array of 2 GB
before its data is read. So shapes are checked before anything is allocated,
and responses are sized before anything is encoded. The checks are pure
functions of a shape or an array; the HTTP layer holds the limits
(``ServerSettings.tensor_limits``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fnrt.functions.errors import ResponseTooLarge, TensorTooLarge

MiB = 1024 * 1024


@dataclass(frozen=True)
class TensorLimits:
    """What one request may ask for. ``max_elements`` bounds the cells of a tensor:
    the product of its dimensions with a 0 counted as 1 (an empty array of shape
    ``[n, 0]`` still costs ``n`` lists to write as JSON)."""

    max_dims: int = 32
    max_elements: int = 64 * MiB
    max_response_bytes: int = 64 * MiB

    def __post_init__(self) -> None:
        if not 1 <= self.max_dims <= 64:  # numpy's own limit is 64
            raise ValueError("max_dims: must be 1 to 64")
        if self.max_elements < 1:
            raise ValueError("max_elements: must be at least 1")
        if self.max_response_bytes < 1024:
            raise ValueError("max_response_bytes: must be at least 1024")


DEFAULT_LIMITS = TensorLimits()
#: For a client reading its own server's answers: numpy's limits only.
UNBOUNDED = TensorLimits(max_dims=64, max_elements=1 << 62, max_response_bytes=1 << 62)


def cells(shape: Iterable[int]) -> int:
    """Product of the dimensions with a 0 counted as 1: what nested lists cost."""
    out = 1
    for dim in shape:
        out *= dim if dim > 1 else 1
    return out


def check_shape(name: str | None, shape: tuple[int, ...] | list[int], limits: TensorLimits) -> None:
    """Raise TensorTooLarge if ``shape`` is past ``limits`` (call before allocating)."""
    if len(shape) > limits.max_dims:
        raise TensorTooLarge(
            name, shape, f"{len(shape)} dimensions, the limit is {limits.max_dims}",
            max_dims=limits.max_dims,
        )  # fmt: skip
    if cells(shape) > limits.max_elements:
        raise TensorTooLarge(
            name,
            shape,
            f"more than the server's limit of {limits.max_elements} elements "
            "(a 0 dimension counts as 1; --max-tensor-elements)",
            max_elements=limits.max_elements,
        )


# Characters per element as JSON at most (digits, sign, point, exponent, comma): an
# estimate never below the real size, so a response under the limit is never refused
# for its estimate alone except for small integers in wide types.
_JSON_INT_WIDTH = {1: 5, 2: 7, 4: 12, 8: 21}
_JSON_FLOAT_WIDTH = {2: 11, 4: 16, 8: 25}


def json_bytes(array: np.ndarray[Any, Any]) -> int:
    """About how many bytes ``array`` takes as JSON nested lists."""
    lists = 2 * cells(array.shape[:-1]) if array.ndim else 0
    if array.dtype.kind == "O":  # bytes elements, written as strings
        if array.size > 1_000_000:  # a bound, not a sum: too many to measure one by one
            return lists + array.size * 4
        return lists + sum(len(item) + 3 for item in array.reshape(-1))
    kind, itemsize = array.dtype.kind, array.dtype.itemsize
    if kind == "b":
        width = 6
    elif kind in "iu":
        width = _JSON_INT_WIDTH.get(itemsize, 21)
    else:
        width = _JSON_FLOAT_WIDTH.get(itemsize, 25)
    return lists + array.size * width


def packed_bytes(array: np.ndarray[Any, Any]) -> int:
    """About how many bytes ``array`` takes in binary (msgpack, OIP's binary extension)."""
    if array.dtype.kind == "O":
        return sum(len(item) + 5 for item in array.reshape(-1)) + 16
    return int(array.nbytes) + 16 * array.ndim + 64


#: Below this many bytes an array's answer is bounded without a closer look.
_SMALL_BYTES = 4096


def check_response(
    outputs: Mapping[str, Any], *, as_json: bool, limits: TensorLimits, hint: str
) -> None:
    """Raise ResponseTooLarge if ``outputs`` would encode past ``limits`` (call before encoding)."""
    size = 0
    for value in outputs.values():
        if not isinstance(value, np.ndarray):
            size += 64
        elif value.size and value.dtype.kind != "O" and value.nbytes < _SMALL_BYTES:
            # small and not empty: a bound without the per-dtype look (each element at
            # most 25 characters and a share of list brackets as JSON)
            size += value.size * 27 + 64 if as_json else value.nbytes + 64
        else:
            size += json_bytes(value) if as_json else packed_bytes(value)
    if size > limits.max_response_bytes:
        raise ResponseTooLarge(size, limits.max_response_bytes, hint)
