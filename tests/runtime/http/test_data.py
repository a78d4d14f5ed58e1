"""The data routes' template: how an answer's head is written at the connection."""

from __future__ import annotations

import pytest

from fnrt.runtime.http.data import header_lines


def test_header_lines_refuse_a_value_with_a_line_break() -> None:
    assert header_lines([(b"x-a", b"1"), (b"x-b", b"two")]) == b"x-a: 1\r\nx-b: two\r\n"
    with pytest.raises(ValueError, match="x-b"):
        header_lines([(b"x-b", b"two\r\nset-cookie: evil")])
