"""JSON bodies of numbers only, converted straight to a float dtype.

A JSON input of nested lists becomes an array of its declared dtype. The general
path (``tensors.as_array``) first lets numpy guess a dtype from the Python values,
then converts, checking the range on the way: two arrays and a copy. When a body
holds no string at all (:class:`Numbers`: its quotes are all its keys'), a list of
it can be made an array of a float32 or float64 input at once, for about half the
time (2.5 against 4.4 us for 64 values), and checked by its sum of squares in that
dtype (:func:`straight`). Anything in doubt takes the general path, which says what
was wrong, if anything: the array or the error is always the general path's.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np


class Numbers(dict[str, Any]):
    """A decoded JSON body whose values hold no string (numbers, booleans, ``null``
    and empty objects, in nested lists): :func:`straight` may convert its lists."""


def marked(body: bytes, inputs: dict[str, Any]) -> dict[str, Any]:
    """``inputs``, decoded from the JSON ``body``, as :class:`Numbers` when no value
    holds a string: a top-level map's quotes are then its keys' (an escaped quote in a
    key, or a repeated key, counts more: not marked). One scan of the body in C, where
    a look at each value of nested lists would be a Python loop."""
    if body.count(b'"') == 2 * len(inputs):
        return Numbers(inputs)
    return inputs


#: The dtypes converted straight -> (the dtype, a bound on the sum of squares taken as
#: it is, a scalar of that dtype: a Python float would be cast, and overflow, first).
#: float32's is 2**106: an integer at or past 2**53 (converted, a square at or past it)
#: becomes a float64 first here, two roundings where the general path's int64 makes
#: one; below it, every integer is a float64 exactly. A sum that overflowed, or a NaN
#: (``null``), is past any bound. float16 is not among them: its sum of squares
#: overflows for ordinary values (64 of 255), and would send nearly every request
#: down both paths.
_STRAIGHT: dict[str, tuple[np.dtype[Any], np.floating[Any]]] = {
    "float32": (np.dtype(np.float32), np.float32(2.0**106)),
    "float64": (np.dtype(np.float64), np.finfo(np.float64).max),
}

# A value past float32's largest overflows as it is converted here, and the general
# path then refuses it (422, saying so): numpy's warning says nothing more. Only this
# module's conversions are hushed (a handler's result that overflows is still warned of).
warnings.filterwarnings(
    "ignore", "overflow encountered in cast", RuntimeWarning, module=re.escape(__name__)
)


def straight(value: list[Any], dtype: str) -> np.ndarray[Any, Any] | None:
    """``value``, a list from a :class:`Numbers` body, as an array of ``dtype`` when
    that is float32 or float64 and every value converts as the general path converts
    it; None: take the general path (ragged lists, ``null``, an overflow, a value too
    large to be sure of, an error numpy was told to raise)."""
    target = _STRAIGHT.get(dtype)
    if target is None:
        return None
    try:
        converted = np.asarray(value, dtype=target[0])
    except (ValueError, TypeError, ArithmeticError, RuntimeWarning):
        return None  # (RuntimeWarning: an overflow, where warnings are made errors)
    if converted.size and not np.vdot(converted, converted) < target[1]:
        return None
    return converted
