"""Moving estimates of a device's link to the server, from its own timed requests.

Each request reports the bytes it moved, its elapsed time and the time the
server says it spent (``X-Fnrt-Server-Ms``); what is left is network time,
``rtt + bytes / bandwidth``. The estimate is a least-squares line through
those samples in which older samples weigh less (each new one multiplies
their weight by ``1 - weight``), so it follows a link that changes. The plan
request (a few KiB) and a bandwidth probe (``probe_bytes``) give it two
sizes to start from; activations and head downloads add more.
"""

from __future__ import annotations

from dataclasses import dataclass

from fnrt.edge.planner import Link


@dataclass(frozen=True)
class LinkConfig:
    """How the estimate moves: ``weight`` of each new sample; the change (relative,
    and in ms) in the time to send ``probe_bytes`` that makes a plan stale; and the
    size of a bandwidth probe."""

    weight: float = 0.2
    replan_change: float = 0.25
    replan_min_ms: float = 2.0
    probe_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        if not 0 < self.weight <= 1:
            raise ValueError("weight: must be a fraction above 0, at most 1")
        if not self.replan_change > 0:
            raise ValueError("replan_change: must be > 0")
        if not self.replan_min_ms >= 0:
            raise ValueError("replan_min_ms: must be >= 0")
        if self.probe_bytes < 1024:
            raise ValueError("probe_bytes: must be at least 1024")


#: The fastest link the estimate reports (1 GB/s): below it, timing noise dominates.
_FASTEST_MS_PER_BYTE = 1e-6
#: Below this spread of sample sizes (bytes) the slope is not refitted.
_MIN_SPREAD_BYTES = 1024.0


class LinkEstimate:
    """The current RTT and bandwidth; None until two sizes have been seen."""

    def __init__(self, config: LinkConfig | None = None) -> None:
        self.config = config or LinkConfig()
        self.samples = 0
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self._ms_per_byte: float | None = None
        self._last: tuple[float, float] | None = None

    def restart(self) -> None:
        """Forget every sample but the newest: the link changed, and older samples
        describe the link before (the next sample of another size fixes the line)."""
        last = self._last
        self.samples = 0
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self._ms_per_byte = None
        if last is not None:
            x, y = last
            self._w, self._x, self._y, self._xx, self._xy = 1.0, x, y, x * x, x * y
            self.samples = 1

    def observe(self, moved_bytes: int, elapsed_s: float, server_s: float = 0.0) -> None:
        """One request: bytes sent plus received, its elapsed time, the server's part."""
        y = max(elapsed_s - server_s, 0.0) * 1000.0
        x = float(moved_bytes)
        self._last = (x, y)
        keep = 1.0 - self.config.weight
        self._w = self._w * keep + 1.0
        self._x = self._x * keep + x
        self._y = self._y * keep + y
        self._xx = self._xx * keep + x * x
        self._xy = self._xy * keep + x * y
        self.samples += 1
        mean_x = self._x / self._w
        variance = self._xx / self._w - mean_x**2
        if variance > _MIN_SPREAD_BYTES**2:
            slope = (self._xy / self._w - mean_x * self._y / self._w) / variance
            # a flat or falling line is noise on a link too fast to time: 1 GB/s and up
            self._ms_per_byte = max(slope, _FASTEST_MS_PER_BYTE)

    @property
    def last_bytes(self) -> int | None:
        """The size of the newest sample."""
        return int(self._last[0]) if self._last is not None else None

    @property
    def link(self) -> Link | None:
        if self._ms_per_byte is None:
            return None
        mean_x, mean_y = self._x / self._w, self._y / self._w
        rtt_ms = max(mean_y - self._ms_per_byte * mean_x, 0.0)
        return Link(1000.0 / self._ms_per_byte, rtt_ms)

    def changed_since(self, planned: Link | None) -> bool:
        """Whether the time to send ``probe_bytes`` (RTT included) moved by more than
        ``replan_change`` and ``replan_min_ms`` since ``planned``. Judged by that time,
        not by bandwidth alone: on a fast link the bandwidth estimate swings with
        timing noise while what it predicts hardly moves."""
        now = self.link
        if now is None or planned is None:
            return now is not planned
        size = self.config.probe_bytes
        before = planned.rtt_ms + planned.transfer_ms(size)
        after = now.rtt_ms + now.transfer_ms(size)
        moved = abs(after - before)
        return moved > self.config.replan_change * before and moved > self.config.replan_min_ms
