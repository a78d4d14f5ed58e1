"""Checking requests and results against a manifest's declared tensors.

These are pure functions: the HTTP layer calls :func:`coerce_request` on every
decoded body before it is queued, and the instance calls :func:`coerce_result`
on every handler result before it is encoded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fnrt.functions.errors import InvalidInput
from fnrt.functions.manifest import TensorSpec

Array = np.ndarray[Any, Any]


def _as_array(name: str, value: Any, spec: TensorSpec | None) -> Array:
    if isinstance(value, np.ndarray):
        if spec is not None and value.dtype != np.dtype(spec.dtype):
            raise InvalidInput(
                f"input '{name}': expected dtype {spec.dtype}, got {value.dtype.name}", input=name
            )
        return value
    # JSON: nested lists (or a scalar) take the declared dtype when no value is lost.
    try:
        inferred = np.asarray(value)
    except (ValueError, TypeError):
        raise InvalidInput(f"input '{name}': not a rectangular array", input=name) from None
    if inferred.dtype.kind not in "biuf":
        raise InvalidInput(
            f"input '{name}': elements must be numbers or booleans, got {_describe(inferred)}",
            input=name,
        )
    if spec is None:
        return inferred
    target = np.dtype(spec.dtype)
    integral = inferred.dtype.kind in "iu" and target.kind in "iu"  # range-checked below
    if inferred.size and not (integral or np.can_cast(inferred.dtype, target, casting="same_kind")):
        raise InvalidInput(
            f"input '{name}': expected dtype {spec.dtype}, got {inferred.dtype.kind}-kind values",
            input=name,
        )
    converted = inferred.astype(target)
    if target.kind in "biu" and inferred.size and not np.array_equal(converted, inferred):
        raise InvalidInput(f"input '{name}': values out of range for {spec.dtype}", input=name)
    return converted


def _describe(array: Array) -> str:
    return "strings" if array.dtype.kind in "US" else f"{array.dtype.name} values"


def coerce_request(specs: Mapping[str, TensorSpec], raw: Mapping[str, Any]) -> dict[str, Array]:
    """Turn a decoded body into ``{name: array}`` checked against ``specs``.

    With no declared inputs any names are accepted. Raises InvalidInput naming
    the input that is missing, unexpected, or of the wrong dtype or shape.
    """
    if specs:
        missing = [n for n in specs if n not in raw]
        if missing:
            raise InvalidInput(f"missing input '{missing[0]}'", input=missing[0])
        extra = [n for n in raw if n not in specs]
        if extra:
            raise InvalidInput(
                f"unexpected input '{extra[0]}' (expected: {', '.join(specs)})", input=extra[0]
            )
    elif not raw:
        raise InvalidInput("the request has no inputs")
    arrays: dict[str, Array] = {}
    for name, value in raw.items():
        spec = specs.get(name)
        array = _as_array(name, value, spec)
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
        return np.asarray(detach().cpu().numpy())
    return np.asarray(value)


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
            if array.dtype != np.dtype(spec.dtype):
                array = array.astype(spec.dtype)
            if not spec.matches_shape(array.shape):
                raise ValueError(
                    f"output '{name}' has shape {list(array.shape)}, declared {list(spec.shape)}"
                )
        out[str(name)] = array
    return out
