"""The dtype vocabulary: manifest names, numpy dtypes, protocol datatypes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fnrt.functions.dtypes import (
    DTYPE_OF_DATATYPE,
    DTYPES,
    OIP_DATATYPES,
    bytes_array,
    is_numeric,
    name_of,
    numpy_dtype,
)


def test_every_name_maps_both_ways() -> None:
    for name in DTYPES:
        assert name_of(numpy_dtype(name)) == name
        assert DTYPE_OF_DATATYPE[OIP_DATATYPES[name]] == name
    assert numpy_dtype("bfloat16") == np.dtype(ml_dtypes.bfloat16)
    assert numpy_dtype("bytes") == np.dtype(object)
    assert name_of(np.dtype(np.complex64)) is None
    assert is_numeric(numpy_dtype("bfloat16")) and not is_numeric(numpy_dtype("bytes"))


def test_bytes_array_from_strings_bytes_and_numpy_strings() -> None:
    out = bytes_array([["\u00e9", b"\x00"], [np.bytes_(b"z"), "q"]])
    assert out.dtype == object and out.shape == (2, 2)
    assert out.tolist() == [["\u00e9".encode(), b"\x00"], [b"z", b"q"]]
    assert bytes_array(np.array(["ab", "c"])).tolist() == [b"ab", b"c"]


@pytest.mark.parametrize(
    ("value", "words"),
    [([1, 2], "got int"), ([["a"], ["b", "c"]], "rectangular"), (np.zeros(2), "float64")],
)
def test_bytes_array_refuses_other_things(value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        bytes_array(value)
