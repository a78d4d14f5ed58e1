"""Invocation traces in the Azure Functions 2019 layout, read, written and made up.

The published ``invocations_per_function_md.anon.d*.csv`` files have a
header ``HashOwner,HashApp,HashFunction,Trigger,1,...,1440`` and one row per
function with its invocations in each minute of one day. Several day files
in a row are one longer trace. The app memory files
(``app_memory_percentiles.anon.d*.csv``: ``HashOwner,HashApp,SampleCount,
AverageAllocatedMb,...``) give each app's memory.

:func:`synthetic` writes traces of the same layout with the trace's known
shapes (periodic timers, bursty HTTP functions, rare functions, daily
cycles), so tests and examples need no download.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fnrt.functions.errors import FnrtError

MINUTES = 1440
_ID_COLUMNS = ["HashOwner", "HashApp", "HashFunction", "Trigger"]


class TraceError(FnrtError):
    """A trace file that is not in the published layout; names the file and line."""


@dataclass
class Trace:
    """Per-minute invocation counts: ``counts[f, m]`` for function ``f``, minute ``m``."""

    functions: list[str]  # HashFunction
    apps: list[str]  # HashApp
    triggers: list[str]
    counts: np.ndarray  # int32, shape (functions, minutes)
    memory_mb: np.ndarray | None = None  # per function, from its app; NaN when unknown

    @property
    def minutes(self) -> int:
        return int(self.counts.shape[1])


def read_invocations(paths: Sequence[Path]) -> Trace:
    """Read one or more day files (in order) into one trace; TraceError names the line."""
    if not paths:
        raise TraceError("no trace file given")
    order: dict[tuple[str, str, str], int] = {}
    triggers: list[str] = []
    days: list[dict[int, np.ndarray]] = []
    for path in paths:
        rows: dict[int, np.ndarray] = {}
        try:
            handle = path.open(newline="", encoding="utf-8")
        except OSError as exc:
            raise TraceError(f"{path}: {exc.strerror}") from None
        with handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            expected = _ID_COLUMNS + [str(m) for m in range(1, MINUTES + 1)]
            if header != expected:
                raise TraceError(
                    f"{path}:1: header must be {','.join(_ID_COLUMNS)},1,...,{MINUTES}"
                )
            for line, row in enumerate(reader, start=2):
                if not row:
                    continue
                if len(row) != len(expected):
                    raise TraceError(f"{path}:{line}: {len(row)} fields, expected {len(expected)}")
                try:
                    values = np.array([int(x) for x in row[4:]], dtype=np.int32)
                except ValueError:
                    bad = next(x for x in row[4:] if not x.strip().lstrip("-").isdigit())
                    raise TraceError(f"{path}:{line}: {bad!r} is not a count") from None
                if (values < 0).any():
                    raise TraceError(f"{path}:{line}: negative count")
                key = (row[0], row[1], row[2])
                if key not in order:
                    order[key] = len(order)
                    triggers.append(row[3])
                index = order[key]
                if index in rows:
                    raise TraceError(f"{path}:{line}: function {row[2]} appears twice")
                rows[index] = values
        days.append(rows)
    counts = np.zeros((len(order), MINUTES * len(paths)), dtype=np.int32)
    for day, rows in enumerate(days):
        for index, values in rows.items():
            counts[index, day * MINUTES : (day + 1) * MINUTES] = values
    keys = list(order)
    return Trace([k[2] for k in keys], [k[1] for k in keys], triggers, counts)


def read_app_memory(path: Path, trace: Trace) -> None:
    """Set ``trace.memory_mb`` from an app-memory file (AverageAllocatedMb per app)."""
    memory: dict[str, float] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None) or []
        if header[:4] != ["HashOwner", "HashApp", "SampleCount", "AverageAllocatedMb"]:
            raise TraceError(f"{path}:1: not an app memory file")
        for line, row in enumerate(reader, start=2):
            try:
                memory[row[1]] = float(row[3])
            except (IndexError, ValueError):
                raise TraceError(f"{path}:{line}: no AverageAllocatedMb") from None
    trace.memory_mb = np.array([memory.get(app, np.nan) for app in trace.apps])


def write_invocations(
    trace: Trace, folder: Path, prefix: str = "invocations_per_function_md.anon"
) -> list[Path]:
    """Write ``trace`` as day files ``{prefix}.d01.csv``, ... in the published layout."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    header = _ID_COLUMNS + [str(m) for m in range(1, MINUTES + 1)]
    for day in range(trace.minutes // MINUTES):
        path = folder / f"{prefix}.d{day + 1:02d}.csv"
        block = trace.counts[:, day * MINUTES : (day + 1) * MINUTES]
        with path.open("w", newline="", encoding="utf-8") as handle:
            handle.write(",".join(header) + "\n")
            for f, name in enumerate(trace.functions):
                ids = f"{trace.apps[f]},{trace.apps[f]},{name},{trace.triggers[f]}"
                handle.write(ids + "," + ",".join(map(str, block[f].tolist())) + "\n")
        paths.append(path)
    return paths


SHAPES = ("timer", "http", "rare", "daily")


@dataclass(frozen=True)
class Shape:
    """How a synthetic day differs from the default one (each 1.0: the real trace's mix).

    ``memory_median_mb``/``memory_sigma``: the functions' sizes (lognormal);
    ``rate``: calls scale by it (timers fire ``rate`` times as often, bursts and rare
    calls come ``rate`` times as often); ``burstiness``: bursts come ``burstiness``
    times less often and last ``burstiness`` times longer (the same calls, lumpier).
    """

    memory_median_mb: float = 150.0
    memory_sigma: float = 0.8
    rate: float = 1.0
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if not self.memory_median_mb > 0 or not self.memory_sigma >= 0:
            raise ValueError("memory_median_mb: must be > 0; memory_sigma: must be >= 0")
        if not self.rate > 0 or not self.burstiness > 0:
            raise ValueError("rate, burstiness: must be > 0")

    @property
    def label(self) -> str:
        return (
            f"{self.memory_median_mb:g} MB (sigma {self.memory_sigma:g}), "
            f"rate x{self.rate:g}, bursts x{self.burstiness:g}"
        )


#: Synthetic days unlike each other, for checking that a default carries over: small and
#: large functions, sparse and busy, smooth and bursty (``fnrt simulate --synthetic``'s
#: ``--shape``, ``bench/prewarm.py``).
VARIED_SHAPES = (
    Shape(),
    Shape(memory_median_mb=40, memory_sigma=0.5),
    Shape(memory_median_mb=2000, memory_sigma=1.2),
    Shape(rate=0.25),
    Shape(rate=4.0, memory_median_mb=600),
    Shape(burstiness=4.0, memory_median_mb=80),
    Shape(burstiness=0.3, rate=0.5, memory_median_mb=1200, memory_sigma=0.3),
)


def synthetic(functions: int, days: int = 1, seed: int = 0, shape: Shape | None = None) -> Trace:
    """A made-up trace with the shapes of the real one, in its layout.

    - ``timer``: every 1 to 60 minutes, from a random offset (most of the real
      trace's invocations);
    - ``http``: bursts (Poisson arrivals of bursts, each several busy minutes)
      over a daily cycle;
    - ``rare``: a handful of calls a day at random times;
    - ``daily``: a job at the same few times every day (time-of-day's case).

    ``shape`` varies sizes, rates and burstiness (:class:`Shape`; the default
    draws the same trace as before it existed).
    """
    shape = shape or Shape()
    rng = np.random.default_rng(seed)
    minutes = MINUTES * days
    counts = np.zeros((functions, minutes), dtype=np.int32)
    shapes = rng.choice(len(SHAPES), size=functions, p=[0.35, 0.35, 0.2, 0.1])
    of_day = np.arange(minutes) % MINUTES
    cycle = 0.55 + 0.45 * np.sin(2 * np.pi * (of_day - 8 * 60) / MINUTES)  # peak mid-day
    rate, lumps = shape.rate, shape.burstiness
    for f in range(functions):
        kind = SHAPES[shapes[f]]
        if kind == "timer":
            period = max(1, round(int(rng.choice([1, 2, 5, 10, 15, 30, 60])) / rate))
            counts[f, int(rng.integers(period)) :: period] = 1
        elif kind == "http":
            bursts = rng.poisson(rng.uniform(2, 40) * rate / lumps / MINUTES * cycle)
            for start in np.nonzero(bursts)[0]:
                length = max(1, round(int(rng.integers(1, 8)) * lumps))
                counts[f, start : start + length] += rng.poisson(rng.uniform(1, 20), size=length)[
                    : minutes - start
                ].astype(np.int32)
        elif kind == "rare":
            many = max(1, round(int(rng.integers(1, 6)) * rate)) * days
            calls = rng.integers(0, minutes, size=many)
            np.add.at(counts[f], calls, 1)
        else:
            times = rng.integers(0, MINUTES, size=int(rng.integers(1, 4)))
            for day in range(days):
                jitter = rng.integers(-1, 2, size=len(times))
                counts[f, np.clip(day * MINUTES + times + jitter, 0, minutes - 1)] += 1
    names = [f"{rng.bytes(16).hex()}" for _ in range(functions)]
    triggers = ["timer" if SHAPES[s] in ("timer", "daily") else "http" for s in shapes]
    memory = rng.lognormal(np.log(shape.memory_median_mb), shape.memory_sigma, size=functions)
    return Trace(names, names, triggers, counts, memory.round().clip(min=1))


def subset(trace: Trace, rows: Iterable[int]) -> Trace:
    chosen = list(rows)
    return Trace(
        [trace.functions[i] for i in chosen],
        [trace.apps[i] for i in chosen],
        [trace.triggers[i] for i in chosen],
        trace.counts[chosen],
        trace.memory_mb[chosen] if trace.memory_mb is not None else None,
    )
