"""Checking requests and results against a manifest's declared tensors.

These are pure functions: the HTTP layer calls :func:`coerce_request` on every
decoded body before it is queued, and the instance calls :func:`coerce_result`
on every handler result before it is encoded.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from fnrt.functions.dtypes import BFLOAT16, bytes_array, is_numeric, name_of, numpy_dtype
from fnrt.functions.errors import InvalidInput
from fnrt.functions.manifest import TensorSpec
from fnrt.functions.numbers import Numbers, straight

Array = np.ndarray[Any, Any]


def as_array(name: str, value: Any, spec: TensorSpec | None, numbers: bool = False) -> Array:
    """One decoded value as an array of the declared dtype; raises InvalidInput naming it.
    ``numbers``: ``value`` comes from a body of numbers (``numbers.Numbers``): a list
    of it may be converted straight to its float dtype (``numbers.straight``)."""
    if numbers and type(value) is list and spec is not None:
        converted = straight(value, spec.dtype)
        if converted is not None:
            return converted
    if spec is not None and spec.dtype == "bytes":
        try:
            return bytes_array(value)
        except ValueError as exc:
            raise InvalidInput(f"input '{name}': {exc}", input=name) from None
    if isinstance(value, np.ndarray):
        if spec is not None and value.dtype != numpy_dtype(spec.dtype):
            got = name_of(value.dtype) or value.dtype
            raise InvalidInput(
                f"input '{name}': expected dtype {spec.dtype}, got {got}", input=name
            )
        return value
    try:
        inferred = np.asarray(value)
    except (ValueError, TypeError):
        raise InvalidInput(f"input '{name}': not a rectangular array", input=name) from None
    return from_plain(name, inferred, spec)


def from_plain(name: str, inferred: Array, spec: TensorSpec | None) -> Array:
    """Values parsed from JSON (numpy's own guess of their dtype) in the declared dtype,
    when no value is lost; raises InvalidInput naming the input."""
    if spec is not None and spec.dtype == "bytes":
        try:
            return bytes_array(inferred)
        except ValueError as exc:
            raise InvalidInput(f"input '{name}': {exc}", input=name) from None
    if inferred.dtype.kind not in "biuf":
        raise InvalidInput(
            f"input '{name}': elements must be numbers or booleans, got {_describe(inferred)}",
            input=name,
        )
    if spec is None:
        return inferred
    # Floats within the target's largest (NaN is not) cannot overflow: the usual
    # request converts without the error-state switch and a look at every converted
    # value. Their sum of squares within the largest's square says so in one BLAS call
    # (each square is at most the sum; 1.5 against 3.3 us for 64 values as a largest
    # absolute value); past it (an overflow, a NaN, or many values near the largest),
    # the general path below says which error, if any. (bfloat16 is not among them.)
    fast = _FLOAT_TARGETS.get(spec.dtype)
    if (
        fast is not None
        and inferred.dtype.kind == "f"
        and (not inferred.size or np.vdot(inferred, inferred) <= fast[1])
    ):
        return inferred.astype(fast[0])
    target = numpy_dtype(spec.dtype)
    integral = inferred.dtype.kind in "iu" and target.kind in "iu"  # range-checked below
    floating = target == BFLOAT16 and inferred.dtype.kind in "biuf"
    if inferred.size and not (
        integral or floating or np.can_cast(inferred.dtype, target, casting="same_kind")
    ):
        raise InvalidInput(
            f"input '{name}': expected dtype {spec.dtype}, got {inferred.dtype.kind}-kind values",
            input=name,
        )
    with np.errstate(over="ignore"):
        converted = inferred.astype(target)
    if target.kind in "biu" and inferred.size and not np.array_equal(converted, inferred):
        raise InvalidInput(f"input '{name}': values out of range for {spec.dtype}", input=name)
    if (target.kind == "f" or floating) and not np.isfinite(converted).all():
        # JSON has no literal for infinity: a finite number that became one overflowed
        raise InvalidInput(
            f"input '{name}': values out of range for {spec.dtype} (they would become "
            f"infinite; its largest is {_largest(target):.4g})",
            input=name,
        )
    return converted


def _largest(dtype: np.dtype[Any]) -> float:
    largest = _LARGEST.get(dtype)
    if largest is None:
        largest = _LARGEST[dtype] = (
            float(np.finfo(dtype).max) if dtype.kind == "f" else 3.3895313892515355e38
        )
    return largest


#: _largest's answers, per dtype (the few float dtypes a manifest can declare).
_LARGEST: dict[np.dtype[Any], float] = {}


def _squared(dtype: np.dtype[Any]) -> float:
    """The square of ``dtype``'s largest value, at most float64's largest (a float64
    target's values past 1.3e154 then take the general path, which keeps them)."""
    largest = _largest(dtype)
    return min(largest * largest, sys.float_info.max)  # (not inf)


#: The float dtypes a manifest names -> (their numpy dtype, ``_squared``): looked up by
#: name (a numpy dtype hashes in about half a microsecond, a string in a few ns).
_FLOAT_TARGETS: dict[str, tuple[np.dtype[Any], float]] = {
    name: (numpy_dtype(name), _squared(numpy_dtype(name)))
    for name in ("float16", "float32", "float64")
}


def _describe(array: Array) -> str:
    return "strings" if array.dtype.kind in "US" else f"{array.dtype.name} values"


def coerce_request(specs: Mapping[str, TensorSpec], raw: Mapping[str, Any]) -> dict[str, Array]:
    """Turn a decoded body into ``{name: array}`` checked against ``specs``.

    With no declared inputs any names are accepted. Raises InvalidInput naming
    the input that is missing, unexpected, or of the wrong dtype or shape.
    """
    if specs:
        if raw.keys() != specs.keys():
            missing = [n for n in specs if n not in raw]
            if missing:
                raise InvalidInput(f"missing input '{missing[0]}'", input=missing[0])
            extra = next(n for n in raw if n not in specs)
            raise InvalidInput(
                f"unexpected input '{extra}' (expected: {', '.join(specs)})", input=extra
            )
    elif not raw:
        raise InvalidInput("the request has no inputs")
    arrays: dict[str, Array] = {}
    numbers = type(raw) is Numbers
    for name, value in raw.items():
        spec = specs.get(name)
        array = as_array(name, value, spec, numbers)
        if spec is not None and not spec.matches_shape(array.shape):
            raise InvalidInput(
                f"input '{name}': expected shape {list(spec.shape)}, got {list(array.shape)}",
                input=name,
            )
        arrays[name] = array
    return arrays


def to_numpy(value: Any) -> Array:
    """Any array-like a handler returns (numpy, torch on any device, lists) as numpy."""
    if isinstance(value, np.ndarray):
        return value
    detach = getattr(value, "detach", None)
    if detach is not None:  # a torch tensor, possibly on a GPU
        tensor = detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":  # numpy has no bfloat16 of its own
            return np.asarray(tensor.view(dtype=_torch_int16()).numpy()).view(BFLOAT16)
        return np.asarray(tensor.numpy())
    return np.asarray(value)


def _torch_int16() -> Any:
    import torch  # only reached with a torch tensor in hand

    return torch.int16


def _as_declared(name: str, array: Array, dtype: str) -> Array:
    """A result array in its declared dtype (strings become UTF-8 bytes for ``bytes``)."""
    if dtype == "bytes":
        try:
            return bytes_array(array)
        except ValueError as exc:
            raise ValueError(f"output '{name}': {exc}") from None
    target = numpy_dtype(dtype)
    if array.dtype == target:
        return array
    if not is_numeric(array.dtype):
        raise ValueError(f"output '{name}' holds {array.dtype} values, declared {dtype}")
    return array.astype(target)


def coerce_result(specs: Mapping[str, TensorSpec], result: Any) -> dict[str, Array]:
    """Check one handler result against the declared outputs; raise ValueError if off.

    Values are converted to numpy and cast to the declared dtype.
    """
    if not isinstance(result, Mapping):
        raise ValueError(
            f"each result must be a mapping of output name to array, got {type(result).__name__}"
        )
    if specs:
        missing = [n for n in specs if n not in result]
        extra = [n for n in result if n not in specs]
        if missing or extra:
            raise ValueError(
                f"result outputs {sorted(result)} do not match the declared outputs {sorted(specs)}"
            )
    out: dict[str, Array] = {}
    for name, value in result.items():
        array = to_numpy(value)
        spec = specs.get(name)
        if spec is not None:
            array = _as_declared(name, array, spec.dtype)
            if not spec.matches_shape(array.shape):
                raise ValueError(
                    f"output '{name}' has shape {list(array.shape)}, declared {list(spec.shape)}"
                )
        out[str(name)] = array
    return out
