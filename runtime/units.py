"""Sizes and durations as people write them: ``2GiB``, ``512 MB``, ``250ms``, ``5m``.

Every ``*-bytes`` flag and ``FNRT_*_BYTES`` variable takes a size; every ``*-s``
flag and ``FNRT_*_S`` variable takes a duration. A bare number keeps its old
meaning (bytes, seconds).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)
_BYTES = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SECONDS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_bytes(text: str) -> int:
    """``"2GiB"`` -> 2147483648; ValueError naming the units it takes."""
    return int(
        _scaled(
            text,
            _BYTES,
            "a size: a number of bytes, or with a unit (B, KB, MB, GB, TB; "
            "KiB, MiB, GiB, TiB), e.g. 2GiB",
        )
    )


def parse_seconds(text: str) -> float:
    """``"250ms"`` -> 0.25, ``"5m"`` -> 300.0, ``"7d"`` -> 604800.0; ValueError naming the
    units it takes."""
    return _scaled(
        text,
        _SECONDS,
        "a duration: a number of seconds, or with a unit (ms, s, m, h, d), e.g. 250ms or 5m",
    )


def _scaled(text: str, units: Mapping[str, float], what: str) -> float:
    """A number with an optional unit from ``units``, times that unit's factor."""
    match = _SIZE.fullmatch(str(text))
    if match is None or match.group(2).lower() not in units:
        raise ValueError(f"{text!r} is not {what}")
    return float(match.group(1)) * units[match.group(2).lower()]


def format_bytes(size: int) -> str:
    """``21474836480`` -> ``"20GiB"``: the largest binary unit that divides it, else bytes."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)
