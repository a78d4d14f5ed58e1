"""The Prometheus text format (0.0.4) of the series fnrt keeps itself, written as
``prometheus_client``'s ``generate_latest`` writes it, line for line.

A node that has served thousands of functions keeps about a hundred lines of
series for each (four histograms, the counters, the state gauges), and a scrape
runs on the event loop. ``prometheus_client`` builds a sample object and formats
every line at every scrape: 0.6 s of the loop's time at 1,000 functions, 6.6 s at
10,000, every 15 s or so. Here each label set's lines are kept from the last
scrape and written again only when its values changed; a cold function's lines
are a lookup and a comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import compress
from operator import ne
from typing import Generic, TypeVar, cast

from prometheus_client.utils import floatToGoString

#: A label set: its values, in the order of the series' label names.
Key = tuple[str, ...]
#: What a label set holds (compared with ``==`` against the last scrape's).
V = TypeVar("V")


def header(name: str, documentation: str, kind: str) -> str:
    """The ``# HELP`` and ``# TYPE`` lines of a family."""
    text = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {text}\n# TYPE {name} {kind}\n"


_go_float = cast(Callable[[float], str], floatToGoString)


def number(value: float) -> str:
    """A sample's value as Prometheus writes it (``1.0``, ``+Inf``, ``1.5e+07``): as
    ``prometheus_client``'s ``floatToGoString``, which is ``repr`` below a million."""
    if 0.0 <= value < 1e6:
        return repr(float(value))
    return _go_float(value)


def labels(names: Iterable[str], values: Iterable[str]) -> str:
    """``{a="x",b="y"}``: the pairs sorted by name, values escaped (backslash,
    newline, double quote); empty with no labels."""
    pairs = sorted(zip(names, values, strict=True))
    if not pairs:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in pairs) + "}"


def bucket_labels(names: Iterable[str], values: Iterable[str]) -> tuple[str, str]:
    """What comes before and after a histogram bucket's ``le`` value in its labels:
    ``('{a="x",le="', '",z="y"}')``, the pairs sorted by name with ``le`` among them."""
    pairs = sorted(zip(names, values, strict=True))
    head = "".join(f'{name}="{_escape(value)}",' for name, value in pairs if name < "le")
    tail = "".join(f',{name}="{_escape(value)}"' for name, value in pairs if name > "le")
    return f'{{{head}le="', f'"{tail}}}'


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def chunks(parts: Iterable[bytes], size_bytes: int) -> Iterator[bytes]:
    """``parts`` joined into pieces of about ``size_bytes`` (the last may be smaller):
    a body of tens of megabytes sent without being made whole."""
    group: list[bytes] = []
    held = 0
    for part in parts:
        group.append(part)
        held += len(part)
        if held >= size_bytes:
            yield b"".join(group)
            group, held = [], 0
    if group:
        yield b"".join(group)


class Kept(Generic[V]):
    """Each label set's lines as last written, with the values they were written
    from: :meth:`lines` writes a set's lines again (``write(key, values)``) only when
    its values changed since, keeping ``copy(values)`` to compare with next time.
    Finding what changed takes no Python frame a label set (``map`` over C
    functions): about 0.15 us each, so 10,000 functions' series are read in
    milliseconds."""

    def __init__(self, write: Callable[[Key, V], str], copy: Callable[[V], V]) -> None:
        self._write = write
        self._copy = copy
        self._order: list[Key] = []  # the label sets, sorted
        self._last: list[object] = []  # what each was last written from, in that order
        self._lines: list[bytes] = []  # and what was written

    def lines(self, series: Mapping[Key, V]) -> list[bytes]:
        """The lines of every label set of ``series``, sorted by label values, a part
        for each (the list is this object's: read it before the next call)."""
        if len(self._order) != len(series):  # one added (or gone, and more added)
            self._sort(series)
        try:
            now = list(map(series.__getitem__, self._order))
        except KeyError:  # one gone (a version no longer held), as many added
            self._sort(series)
            now = list(map(series.__getitem__, self._order))
        order, last, lines = self._order, self._last, self._lines
        for i in compress(range(len(now)), map(ne, now, last)):
            values = now[i]
            lines[i] = self._write(order[i], values).encode()
            last[i] = self._copy(values)
        return lines

    def _sort(self, series: Mapping[Key, V]) -> None:
        """Order the label sets of ``series`` again, keeping what was written of
        those still there (one new is written at once: nothing equals ``_NEW``)."""
        kept = dict(zip(self._order, zip(self._last, self._lines, strict=True), strict=True))
        self._order = sorted(series)
        self._last = [kept.get(key, _NEW)[0] for key in self._order]
        self._lines = [kept.get(key, _NEW)[1] for key in self._order]


#: What a new label set was "last written from": equal to no values, so it is written.
_NEW: tuple[object, bytes] = (object(), b"")
