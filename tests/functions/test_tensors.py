from __future__ import annotations

import numpy as np
import pytest
import torch

from fnrt.functions.errors import InvalidInput
from fnrt.functions.manifest import TensorSpec
from fnrt.functions.tensors import coerce_request, coerce_result, from_plain

SPECS = {"x": TensorSpec("float32", (-1, 2)), "ids": TensorSpec("int64", (-1,))}


def test_json_lists_take_the_declared_dtype() -> None:
    out = coerce_request(SPECS, {"x": [[1, 2]], "ids": [3]})
    assert out["x"].dtype == np.float32 and out["ids"].dtype == np.int64


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"x": [[1, 2]]}, "missing input 'ids'"),
        ({"x": [[1, 2]], "ids": [1], "z": 1}, "unexpected input 'z'"),
        ({"x": [[1, 2, 3]], "ids": [1]}, "input 'x': expected shape [-1, 2], got [1, 3]"),
        ({"x": [[1, 2]], "ids": [1.5]}, "input 'ids': expected dtype int64"),
        ({"x": [[1, 2]], "ids": ["a"]}, "input 'ids': elements must be numbers"),
        ({"x": [[1], [1, 2]], "ids": [1]}, "input 'x': not a rectangular array"),
        (
            {"x": np.ones((1, 2), np.float64), "ids": [1]},
            "input 'x': expected dtype float32, got float64",
        ),
    ],
)
def test_input_errors_name_the_input(raw: dict, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        coerce_request(SPECS, raw)
    assert message in info.value.message


def test_out_of_range_integers_are_refused() -> None:
    with pytest.raises(InvalidInput, match="out of range for uint8"):
        coerce_request({"p": TensorSpec("uint8", (-1,))}, {"p": [1, 300]})


@pytest.mark.parametrize(
    ("dtype", "value"), [("float32", 1e39), ("float16", 70000), ("bfloat16", -1e39)]
)
def test_json_numbers_that_overflow_their_float_dtype_are_refused(dtype: str, value: float) -> None:
    with pytest.raises(InvalidInput, match=f"out of range for {dtype} \\(they would become"):
        coerce_request({"x": TensorSpec(dtype, (-1,))}, {"x": [1.0, value]})
    # near the largest finite value is kept (rounding is not a loss JSON can see)
    kept = coerce_request({"x": TensorSpec("float32", (-1,))}, {"x": [3.4e38]})["x"]
    assert np.isfinite(kept).all()


def test_float_conversion_keeps_what_rounds_to_the_largest_and_refuses_nan() -> None:
    spec = {"x": TensorSpec("float16", (-1,))}
    # past float16's largest (65504) but rounding down to it: the general path keeps it
    kept = coerce_request(spec, {"x": [65510.0, -65504.0]})["x"]
    assert kept.tolist() == [65504.0, -65504.0] and kept.dtype == np.float16
    with pytest.raises(InvalidInput, match="out of range for float16"):
        coerce_request(spec, {"x": [65520.0]})  # rounds to infinity
    # a NaN (no JSON literal, but from_plain's arrays can come from elsewhere)
    with pytest.raises(InvalidInput, match="out of range for float32"):
        from_plain("x", np.array([1.0, np.nan]), TensorSpec("float32", (-1,)))


def test_values_whose_squares_add_up_past_the_largest_are_kept_all_the_same() -> None:
    """The quick range check (a sum of squares) passes them to the exact one, which
    keeps what is in range: three values near float32's largest, float64's past 1e154."""
    near = coerce_request({"x": TensorSpec("float32", (-1,))}, {"x": [3e38, -3e38, 3e38]})["x"]
    assert near.tolist() == pytest.approx([3e38, -3e38, 3e38], rel=1e-6)
    large = coerce_request({"x": TensorSpec("float64", (-1,))}, {"x": [1e200, -1e300]})["x"]
    assert large.tolist() == [1e200, -1e300]
    with pytest.raises(InvalidInput, match="out of range for float32"):
        from_plain("x", np.array([1.0, np.inf]), TensorSpec("float32", (-1,)))


def test_undeclared_inputs_pass_through() -> None:
    assert coerce_request({}, {"a": [1.0]})["a"].dtype == np.float64
    with pytest.raises(InvalidInput, match="no inputs"):
        coerce_request({}, {})


def test_results_convert_torch_and_cast_to_declared() -> None:
    out = coerce_result(
        {"y": TensorSpec("float32", (-1,))}, {"y": torch.tensor([1.0, 2.0], dtype=torch.float64)}
    )
    assert out["y"].dtype == np.float32
    with pytest.raises(ValueError, match="do not match the declared outputs"):
        coerce_result({"y": TensorSpec("float32", (-1,))}, {"z": [1]})
    with pytest.raises(ValueError, match="has shape"):
        coerce_result({"y": TensorSpec("float32", (-1,))}, {"y": [[1.0]]})
    with pytest.raises(ValueError, match="must be a mapping"):
        coerce_result({}, [1, 2])


BODIES = [
    b'{"x": [[0.5, -2, 1e20, true, false, 3]]}',
    b'{"x": [[1e39, 1]]}',
    b'{"x": [[65510.0, -65504.0]]}',
    b'{"x": [[65520.0]]}',
    b'{"x": [[3e38, -3e38, 3e38]]}',
    b'{"x": [[1e200, -1e300]]}',
    b'{"x": [[null, 1]]}',
    b'{"x": [[1, 2], [3]]}',
    b'{"x": [[{}]]}',
    b'{"x": [[[1]]]}',
    b'{"x": []}',
    b'{"x": 5}',
    b'{"x": [[100000000000000000000000000000]]}',
    b'{"x": [[1152921573326323713]]}',  # past 2**53: rounded once by the general path
    b'{"x": [[9007199254740993, 2]]}',
    b'{"x": [[9007199791611905]]}',  # 2**53 + 2**29 + 1: through a float64, a float32 tie
    b'{"x": [[18446744073709551615, -1]]}',
    b'{"x": [[-0.0, 0, 1e-45, 5e-324]]}',
    b'{"x": [[[]]]}',
]


def _outcome(spec: TensorSpec, raw: dict) -> object:
    try:
        array = coerce_request({"x": spec}, raw)["x"]
    except InvalidInput as exc:
        return str(exc)
    return array.dtype, array.shape, array.tolist()


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("overflow", ["warned", "warnings are errors", "numpy raises"])
def test_a_json_body_of_numbers_converts_as_the_general_path_does(
    dtype: str, overflow: str
) -> None:
    """A body of numbers only (``numbers.Numbers``) is converted straight to its float
    dtype; whatever it holds, the array or the error is the general path's, where an
    overflow is warned of, raised as a warning made an error, or raised by numpy."""
    import warnings

    from fnrt.functions.codec import decode_json
    from fnrt.functions.numbers import Numbers

    spec = TensorSpec(dtype, (-1, -1))
    with (
        warnings.catch_warnings(),
        np.errstate(over="raise" if overflow == "numpy raises" else "warn"),
    ):
        if overflow == "warnings are errors":
            warnings.simplefilter("error")
        for body in BODIES:
            decoded = decode_json(body)
            assert type(decoded) is Numbers, body
            assert _outcome(spec, decoded) == _outcome(spec, dict(decoded)), body
