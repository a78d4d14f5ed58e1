"""JSON bodies of numbers only, converted straight to a float dtype (``test_tensors``
compares the straight path with the general one over many bodies)."""

from __future__ import annotations

import numpy as np

from fnrt.functions.numbers import Numbers, marked, straight


def test_a_body_is_marked_only_when_its_quotes_are_its_keys() -> None:
    inputs = {"x": [[1.0]], "y": [2]}
    assert type(marked(b'{"x": [[1.0]], "y": [2]}', inputs)) is Numbers
    assert type(marked(b'{"x": [[1.0]], "y": ["2"]}', {"x": [[1.0]], "y": ["2"]})) is dict
    assert type(marked(b'{"x": 1, "x": 2}', {"x": 2})) is dict  # a repeated key: not sure


def test_only_float32_and_float64_are_converted_straight() -> None:
    """float16's sum of squares overflows for ordinary values: it keeps the general
    path alone; float32 leaves values at or past 2**53 to it (rounded once there)."""
    assert straight([[255.0] * 64], "float16") is None
    assert straight([[1.5, 2]], "float32").dtype == np.float32  # type: ignore[union-attr]
    assert straight([[2.0**53]], "float32") is None
    assert straight([[2.0**60]], "float64").tolist() == [[2.0**60]]  # type: ignore[union-attr]
    assert straight([[1, 2], [3]], "float32") is None
