"""What the keep-alive policies know of a function: compact, bounded, persistable.

Times are whole minutes, the granularity of the policies (and of the Azure
Functions trace they are judged on). A :class:`History` keeps

- a histogram of idle times, the quiet minutes between two runs of active
  minutes (1-minute bins over ``range_min``, plus a count of longer ones),
  with the running sums its coefficient of variation needs;
- the last few idle times, for a forecast when they exceed the range;
- per minute of the day, which of the last ``days`` days had a call (bits),
  for the time-of-day policy;
- invocations per minute, smoothed, for the trend policy.

Its size is fixed whatever the traffic (a few KB) and it round-trips through
plain JSON, so a restart does not forget.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MINUTES_PER_DAY = 1440


@dataclass(frozen=True)
class HistoryConfig:
    range_min: int = 240  # histogram range: 4 hours of 1-minute bins
    recent_idle: int = 16  # idle times kept for the forecast
    days: int = 14  # days of time-of-day bits
    rate_half_life_min: float = 10.0  # smoothing of the invocation rate

    def __post_init__(self) -> None:
        for name in ("range_min", "recent_idle", "days"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}: must be an integer >= 1")
        if self.days > 62:
            raise ValueError("days: at most 62 (a bit each, in 64-bit integers)")
        if self.rate_half_life_min <= 0:
            raise ValueError("rate_half_life_min: must be > 0")


@dataclass
class History:
    """One function's invocation history (see the module docstring)."""

    config: HistoryConfig = field(default_factory=HistoryConfig)
    bins: list[int] = field(default_factory=list)
    nonzero: list[int] = field(default_factory=list)  # sorted indices of bins > 0
    in_range: int = 0  # sum of bins
    square_sum: int = 0  # sum of bins squared (for the coefficient of variation)
    out_of_range: int = 0
    recent_idle: deque[int] = field(default_factory=deque)
    #: minute of day -> bit d set when called d days ago (numpy: the time-of-day policy
    #: reads hours of it at once)
    day_bits: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    last_minute: int | None = None  # the last active minute
    last_day: int | None = None
    first_day: int | None = None
    rate_per_min: float = 0.0  # smoothed invocations per minute
    rate_minute: int = 0
    slope_per_min: float = 0.0  # smoothed change of the rate, per minute
    invocations: int = 0

    def __post_init__(self) -> None:
        if not self.bins:
            self.bins = [0] * self.config.range_min
        if not len(self.day_bits):
            self.day_bits = np.zeros(MINUTES_PER_DAY, dtype=np.int64)
        self.recent_idle = deque(self.recent_idle, maxlen=self.config.recent_idle)

    @property
    def samples(self) -> int:
        """Idle times seen, in range and beyond."""
        return self.in_range + self.out_of_range

    def _bin(self, idle: int, times: int = 1) -> None:
        if idle < len(self.bins):
            c = self.bins[idle]
            if c == 0:
                bisect.insort(self.nonzero, idle)
            self.bins[idle] = c + times
            self.in_range += times
            self.square_sum += (c + times) ** 2 - c * c
        else:
            self.out_of_range += times

    def record_run(self, first: int, last: int, invocations: int) -> int | None:
        """Calls in every minute from ``first`` to ``last`` (absolute minutes, a run of
        consecutive active minutes). Returns the idle time before the run (minutes
        with no call), None for the first run."""
        if last < first:
            raise ValueError("a run ends before it starts")
        self.invocations += invocations
        idle = None
        if self.last_minute is not None:
            if first <= self.last_minute:  # overlaps what is recorded: count the new part
                first = self.last_minute + 1
                if first > last:
                    self._rate(last, invocations)
                    return None
            else:
                idle = first - self.last_minute - 1
                self._bin(idle)
                self.recent_idle.append(idle)
        self._days(first, last)
        self._rate(last, invocations)
        self.last_minute = last
        return idle

    def record(self, minute: int, count: int = 1) -> int | None:
        """Calls in one minute (the runtime records each invocation's minute)."""
        return self.record_run(minute, minute, count)

    def _days(self, first: int, last: int) -> None:
        minute = first
        while minute <= last:
            day, of_day = divmod(minute, MINUTES_PER_DAY)
            end = min(last, (day + 1) * MINUTES_PER_DAY - 1) - day * MINUTES_PER_DAY
            if self.first_day is None:
                self.first_day = day
            if self.last_day is None or day > self.last_day:
                if self.last_day is not None:  # a new day: every bit one day older
                    shift = min(day - self.last_day, self.config.days)
                    keep = (1 << self.config.days) - 1
                    self.day_bits = (self.day_bits << shift) & keep
                self.last_day = day
            if day == self.last_day:
                self.day_bits[of_day : end + 1] |= 1
            minute = (day + 1) * MINUTES_PER_DAY

    def _rate(self, minute: int, invocations: int) -> None:
        """Exponentially smoothed calls per minute, and the smoothed change of it."""
        elapsed = max(minute - self.rate_minute, 1)
        decay = 0.5 ** (elapsed / self.config.rate_half_life_min)
        before = self.rate_per_min
        self.rate_per_min = before * decay + (1 - decay) * invocations / elapsed
        change = (self.rate_per_min - before) / elapsed
        self.slope_per_min = self.slope_per_min * decay + (1 - decay) * change
        self.rate_minute = minute

    @property
    def days_seen(self) -> int:
        """Days from the first recorded call to the last, both counted."""
        if self.first_day is None or self.last_day is None:
            return 0
        return min(self.last_day - self.first_day + 1, self.config.days)

    def called_on_days(self, minute_of_day: int) -> int:
        """How many of the past days had a call in ``minute_of_day``."""
        return int(self.day_bits[minute_of_day % MINUTES_PER_DAY]).bit_count()

    def days_called_ahead(self, now: int, minutes: int) -> np.ndarray:
        """For each of the ``minutes`` minutes after ``now``, how many past days had a
        call at that time of day (:meth:`called_on_days`, for all of them at once)."""
        of_day = (now + np.arange(1, minutes + 1)) % MINUTES_PER_DAY
        bits = self.day_bits[of_day]
        count = np.zeros(minutes, dtype=np.int64)
        for _ in range(self.config.days):
            count += bits & 1
            bits = bits >> 1
        return count

    # --- persistence ----------------------------------------------------------------

    def copy(self) -> History:
        """An independent copy (its containers copied too), without ``__init__``: a
        snapshot makes one of each history called in a minute, on the event loop."""
        copied = object.__new__(History)
        copied.__dict__.update(self.__dict__)
        copied.bins = self.bins.copy()
        copied.nonzero = self.nonzero.copy()
        copied.recent_idle = self.recent_idle.copy()
        copied.day_bits = self.day_bits.copy()
        return copied

    def to_dict(self) -> dict[str, Any]:
        called = np.flatnonzero(self.day_bits)  # (Python ints: a numpy scalar a minute is slow)
        return {
            "bins": {str(i): c for i, c in enumerate(self.bins) if c},
            "out_of_range": self.out_of_range,
            "recent_idle": list(self.recent_idle),
            "day_bits": dict(
                zip(map(str, called.tolist()), self.day_bits[called].tolist(), strict=True)
            ),
            "last_minute": self.last_minute,
            "last_day": self.last_day,
            "first_day": self.first_day,
            "rate_per_min": self.rate_per_min,
            "rate_minute": self.rate_minute,
            "slope_per_min": self.slope_per_min,
            "invocations": self.invocations,
        }

    @staticmethod
    def from_dict(data: dict[str, Any], config: HistoryConfig | None = None) -> History:
        history = History(config or HistoryConfig())
        for i, c in dict(data.get("bins", {})).items():
            if 0 <= int(i) < len(history.bins):
                history._bin(int(i), int(c))
        history.out_of_range = int(data.get("out_of_range", 0))
        history.recent_idle.extend(int(x) for x in data.get("recent_idle", []))
        keep = (1 << history.config.days) - 1
        for m, b in dict(data.get("day_bits", {})).items():
            if 0 <= int(m) < MINUTES_PER_DAY:
                history.day_bits[int(m)] = int(b) & keep
        for key in ("last_minute", "last_day", "first_day"):
            value = data.get(key)
            setattr(history, key, int(value) if value is not None else None)
        history.rate_per_min = float(data.get("rate_per_min", 0.0))
        history.rate_minute = int(data.get("rate_minute", 0))
        history.slope_per_min = float(data.get("slope_per_min", 0.0))
        history.invocations = int(data.get("invocations", 0))
        return history
