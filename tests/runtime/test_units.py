"""Sizes and durations as people write them."""

from __future__ import annotations

import pytest

from fnrt.runtime.units import format_bytes, parse_bytes, parse_seconds


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1048576", 1 << 20),
        ("2GiB", 2 << 30),
        ("20 GiB", 20 << 30),
        ("512MB", 512_000_000),
        ("1.5 kib", 1536),
        ("64mib", 64 << 20),
        ("7b", 7),
        ("1T", 10**12),
    ],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_bytes(text) == size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("2.5", 2.5),
        ("250ms", 0.25),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("10 s", 10),
        ("7d", 604_800.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "GiB", "2 GiBs", "-1", "2GiB extra", "1e9"])
def test_what_is_not_a_size_says_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size: a number of bytes, or with a unit"):
        parse_bytes(text)


def test_what_is_not_a_duration_says_how_to_write_one() -> None:
    with pytest.raises(ValueError, match=r"'5 days' is not a duration.*e\.g\. 250ms or 5m"):
        parse_seconds("5 days")


@pytest.mark.parametrize(
    ("size", "text"), [(20 << 30, "20GiB"), (64 << 20, "64MiB"), (1536, "1536"), (0, "0")]
)
def test_sizes_are_printed_as_they_are_parsed(size: int, text: str) -> None:
    assert format_bytes(size) == text and parse_bytes(text) == size
