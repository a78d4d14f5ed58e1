"""The data routes' template: how an answer's head is written at the connection."""

from __future__ import annotations

import pytest

from fnrt.runtime.http.data import header_lines


def test_header_lines_refuse_a_value_with_a_line_break() -> None:
    assert header_lines([(b"x-a", b"1"), (b"x-b", b"two")]) == b"x-a: 1\r\nx-b: two\r\n"
    with pytest.raises(ValueError, match="x-b"):
        header_lines([(b"x-b", b"two\r\nset-cookie: evil")])


def test_header_map_decodes_names_and_values_the_last_repeat_winning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Headers by name, decoded as Latin-1 (names once, kept up to a bound whatever
    names clients send), a repeated header's last value winning, as before."""
    from fnrt.runtime.http import data

    monkeypatch.setattr(data, "_NAMES", {})
    monkeypatch.setattr(data, "_NAMES_MAX", 4)
    scope = {"headers": [(b"x-a", b"1"), (b"x-\xe9", b"caf\xe9"), (b"x-a", b"2")]}
    for _ in range(2):
        assert data.header_map(scope) == {"x-a": "2", "x-\xe9": "caf\xe9"}
    many = {"headers": [(b"x-%d" % i, b"v") for i in range(50)]}
    assert data.header_map(many) == {f"x-{i}": "v" for i in range(50)}
    assert len(data._NAMES) <= 4  # forgotten when full, then kept again
    assert data.header_map(scope) == {"x-a": "2", "x-\xe9": "caf\xe9"}
