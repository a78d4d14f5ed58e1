"""The pace of a transfer: bytes moved against the time spent waiting on the peer.

A body trickled a byte at a time never stalls long enough to trip a deadline
between reads, so a deadline alone lets a client hold a connection for ever
at a byte a second. As Kestrel's ``MinRequestBodyDataRate`` and Apache's
``mod_reqtimeout`` (``MinRate``) do, a transfer must instead keep a minimum
rate: each window of ``window_s`` seconds spent waiting on the peer must move
``min_rate_bytes_s * window_s`` bytes. Only time spent waiting on the peer
counts: not the time the server itself paused reading (uvicorn's flow control
stops reading a body past 64 KiB until the application asks for more), nor the
time a client waits for ``100 Continue``.

Nothing here reads a clock: the connection's sweep tells a :class:`Meter` how
long it waited and how many bytes the peer moved in all (``moved``), and the
meter decides.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pace:
    """The minimum rate of a transfer, judged over windows of waiting."""

    min_rate_bytes_s: float = 500.0  # 0: no minimum
    window_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.min_rate_bytes_s >= 0:
            raise ValueError("min_rate_bytes_s: must be >= 0 (0: no minimum)")
        if not self.window_s > 0:
            raise ValueError("window_s: must be > 0")

    @property
    def on(self) -> bool:
        return self.min_rate_bytes_s > 0

    @property
    def grace_s(self) -> float:
        """Waiting before a transfer's rate so far says anything (:meth:`Meter.slow_rate`):
        the first packets of a body may still be on the way."""
        return min(SLOW_GRACE_S, self.window_s)


#: A transfer is judged slow so far (for eviction) only after this much waiting: two
#: sweeps. A body at the default minimum has sent 250 bytes by then.
SLOW_GRACE_S = 0.5


class Meter:
    """One transfer's pace: where it started and its current window."""

    __slots__ = ("start", "waited_s", "window_start", "window_waited_s")

    def __init__(self, moved: int = 0) -> None:
        self.restart(moved)

    def restart(self, moved: int) -> None:
        """A new transfer begins, ``moved`` bytes having moved before it."""
        self.start = self.window_start = moved
        self.waited_s = self.window_waited_s = 0.0

    def wait(self, moved: int, waited_s: float, pace: Pace) -> float | None:
        """``waited_s`` more seconds spent waiting on the peer, ``moved`` bytes moved in
        all: at the end of a window, its rate in bytes/s if under the minimum (the peer
        is too slow); None while the window is open, or when the peer kept the pace."""
        self.waited_s += waited_s
        self.window_waited_s += waited_s
        if self.window_waited_s < pace.window_s:
            return None
        rate = (moved - self.window_start) / self.window_waited_s
        self.window_start, self.window_waited_s = moved, 0.0
        return rate if rate < pace.min_rate_bytes_s else None

    def slow_rate(self, moved: int, pace: Pace) -> float | None:
        """The rate since the transfer began if under the minimum, once it has waited
        ``pace.grace_s``; None otherwise. Orders connections to evict, slowest first."""
        if not pace.on or self.waited_s < pace.grace_s:
            return None
        rate = (moved - self.start) / self.waited_s
        return rate if rate < pace.min_rate_bytes_s else None
