"""Time behind an injectable clock, so scheduling logic is tested without sleeping.

Decisions take ``now`` from :meth:`Clock.now` (monotonic seconds); waiting goes
through :meth:`Clock.sleep` and :meth:`Clock.wait`. :class:`ManualClock` only
moves when a test calls :meth:`ManualClock.advance`, from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any, Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        """Wait for ``event`` up to ``timeout_s``; True if it was set."""
        ...


class SystemClock:
    """The real monotonic clock."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        if event.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()
        return event.is_set()


class ManualClock:
    """A clock that moves only by :meth:`advance`; sleepers wake when it passes them."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has passed."""
        with self._lock:
            self._now += seconds
            due = [(d, f) for d, f in self._sleepers if d <= self._now]
            self._sleepers = [(d, f) for d, f in self._sleepers if d > self._now]
        for _, fut in due:
            fut.get_loop().call_soon_threadsafe(_resolve, fut)

    def _timer(self, seconds: float) -> asyncio.Future[None]:
        """A future resolved once the clock has moved ``seconds`` past now (registered now)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            if seconds <= 0:
                fut.set_result(None)
            else:
                self._sleepers.append((self._now + seconds, fut))
        return fut

    def _forget(self, fut: asyncio.Future[None]) -> None:
        with self._lock:
            self._sleepers = [(d, f) for d, f in self._sleepers if f is not fut]

    async def sleep(self, seconds: float) -> None:
        timer = self._timer(seconds)
        try:
            await timer
        finally:
            self._forget(timer)

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        if event.is_set():
            return True
        timer = self._timer(timeout_s)
        waiter = asyncio.ensure_future(event.wait())
        try:
            pending: set[asyncio.Future[Any]] = {waiter, timer}
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            timer.cancel()
            self._forget(timer)
        return event.is_set()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
