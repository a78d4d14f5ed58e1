"""The circuit breaker of one version: closed, open, or half-open while probing.

``next_state`` is the pure decision; :class:`Breaker` keeps the counts it
reads and is driven with explicit clock times, so tests step through every
transition without sleeping. Only failures on the server's side count
(a handler error, a failed load, a deadline): a malformed request is the
client's fault and says nothing about the version.

Instance deaths count on their own too: ``open_after_deaths`` of them in a
row (a worker that crashed, was killed, ran past its timeout, or whose load
failed; no request served in between) open the breaker however few requests
there were, since the restart backoff keeps a crash loop's requests few. It
stays open while the pool backs off (``not_before``): a probe let through
before the next instance may load would only wait in the queue.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any

from fnrt.functions.manifest import BreakerConfig
from fnrt.runtime.outcomes import Summary


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class Probing:
    """Half-open progress: probes let through, and how many of them finished and failed."""

    sent: int = 0
    finished: int = 0
    failed: int = 0


def next_state(
    config: BreakerConfig,
    state: BreakerState,
    window: Summary,
    opened_at: float,
    probing: Probing,
    now: float,
    *,
    deaths: int = 0,
    not_before: float = 0.0,
) -> BreakerState:
    """Where the breaker goes from ``state`` given what it has seen.

    Closed opens when the window holds ``min_requests`` and its error rate is
    over ``open_error_rate``, or when ``deaths`` (instances lost in a row) reach
    ``open_after_deaths``. Open turns half-open ``open_s`` after opening, and not
    before ``not_before`` (when the pool may load an instance again).
    Half-open opens again once its probes' error rate reaches
    ``close_error_rate`` (more probes cannot bring it under), and closes when
    all ``half_open_probes`` finished under it.
    """
    if not config.enabled:
        return BreakerState.CLOSED
    if state is BreakerState.CLOSED:
        tripped = (
            window.requests >= config.min_requests and window.error_rate > config.open_error_rate
        ) or 0 < config.open_after_deaths <= deaths
        return BreakerState.OPEN if tripped else state
    if state is BreakerState.OPEN:
        ready = now - opened_at >= config.open_s and now >= not_before
        return BreakerState.HALF_OPEN if ready else state
    if probing.failed / config.half_open_probes >= config.close_error_rate:
        return BreakerState.OPEN
    if probing.finished >= config.half_open_probes:
        return BreakerState.CLOSED
    return state


class Rolling:
    """Requests and failures over the last ``window_s``: amortised O(1) per record (the
    outcomes of one moment, a batch's, one entry)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._items: deque[tuple[float, int, int]] = deque()  # time, requests, failures
        self.requests = 0
        self.errors = 0

    def add(self, now: float, failed: bool, count: int = 1) -> None:
        errors = count if failed else 0
        self._items.append((now, count, errors))
        self.requests += count
        self.errors += errors
        self.trim(now)

    def trim(self, now: float) -> None:
        items = self._items
        while items and items[0][0] < now - self.window_s:
            _, count, errors = items.popleft()
            self.requests -= count
            self.errors -= errors

    def summary(self, now: float) -> Summary:
        self.trim(now)
        return Summary(self.requests, self.errors, 0.0)

    def clear(self) -> None:
        self._items.clear()
        self.requests = self.errors = 0


class Breaker:
    """One version's breaker state and the outcomes it decides on."""

    def __init__(self, config: BreakerConfig) -> None:
        self.config = config
        self.state = BreakerState.CLOSED
        self.opened_at = 0.0
        self.probing = Probing()
        self.window = Rolling(config.window_s)
        self.opened = 0  # times it opened, for describe
        self.deaths = 0  # instances lost in a row (no request served since)
        self.not_before = 0.0  # clock time before which the pool loads no instance

    def allow(self, now: float) -> bool:
        """True: send this request to the version (as a probe when half-open).

        False: answer it with the fallback.
        """
        if self.state is BreakerState.CLOSED:  # the hot path: nothing to decide
            return True
        self._step(now)
        if self.state is BreakerState.OPEN:
            return False
        if self.state is BreakerState.HALF_OPEN:
            if self.probing.sent >= self.config.half_open_probes:
                return False
            p = self.probing
            self.probing = Probing(p.sent + 1, p.finished, p.failed)
        return True

    def record(self, now: float, failed: bool, count: int = 1) -> None:
        """The outcome of a request :meth:`allow` let through (of ``count`` of them)."""
        if not failed:
            self.deaths = 0  # an instance served: whatever died before is not a loop
        if not self.config.enabled:
            return
        if count != 1 and self.state is not BreakerState.CLOSED:
            for _ in range(count):  # each may change the state: one at a time
                self.record(now, failed)
            return
        self.window.add(now, failed, count)
        if self.state is BreakerState.HALF_OPEN:
            p = self.probing
            self.probing = Probing(p.sent, p.finished + 1, p.failed + int(failed))
        elif not failed:
            return  # a success never opens a closed breaker
        self._step(now)

    def lost(self, now: float, retry_at: float) -> bool:
        """An instance died (or its load failed on the handler's side); the pool loads
        none again before ``retry_at``. True when that opened the breaker."""
        self.deaths += 1
        self.not_before = retry_at
        if not self.config.enabled or self.state is BreakerState.OPEN:
            return False
        if self.state is BreakerState.HALF_OPEN:  # a probe killed it: open again now
            self._open(now)
            return True
        opened = self.opened
        self._step(now)
        return self.opened > opened

    def retry_after_s(self, now: float) -> float:
        """How long until it may let a probe through (at least a second): what a
        request refused while it is open is told to wait (``Retry-After``)."""
        ready = max(self.opened_at + self.config.open_s, self.not_before)
        return max(ready - now, 1.0)

    def _open(self, now: float) -> None:
        self.state = BreakerState.OPEN
        self.opened_at = now
        self.opened += 1
        self.probing = Probing()

    def _step(self, now: float) -> None:
        state = next_state(
            self.config,
            self.state,
            self.window.summary(now),
            self.opened_at,
            self.probing,
            now,
            deaths=self.deaths,
            not_before=self.not_before,
        )
        if state is self.state:
            return
        if state is BreakerState.OPEN:
            self.opened_at = now
            self.opened += 1
        if state is not BreakerState.HALF_OPEN:
            self.probing = Probing()
        if state is BreakerState.CLOSED:
            self.window.clear()  # judge afresh: the failures before it opened are history
        self.state = state

    def describe(self, now: float) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "opened": self.opened,
            "deaths_in_a_row": self.deaths,
            "window": self.window.summary(now).to_dict(),
        }
