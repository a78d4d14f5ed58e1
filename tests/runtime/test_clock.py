from __future__ import annotations

import asyncio

import pytest

from fnrt.runtime.clock import ManualClock, SystemClock


def test_manual_clock_wakes_sleepers_only_when_advanced() -> None:
    async def scenario() -> list[str]:
        clock = ManualClock(start=0)
        order: list[str] = []

        async def sleeper(name: str, s: float) -> None:
            await clock.sleep(s)
            order.append(name)

        tasks = [
            asyncio.ensure_future(sleeper("late", 10)),
            asyncio.ensure_future(sleeper("early", 5)),
        ]
        await asyncio.sleep(0)
        clock.advance(4)
        await asyncio.sleep(0)
        assert order == []
        clock.advance(1)
        await asyncio.sleep(0.01)
        assert order == ["early"]
        clock.advance(5)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["early", "late"]


def test_wait_returns_on_event_or_timeout() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        clock = ManualClock()
        event = asyncio.Event()
        waiting = asyncio.ensure_future(clock.wait(event, 60))
        await asyncio.sleep(0)
        clock.advance(60)
        timed_out = await waiting
        event.set()
        got = await clock.wait(event, 60)
        real = await SystemClock().wait(asyncio.Event(), 0.001)
        return timed_out, got, real

    assert asyncio.run(scenario()) == (False, True, False)


def test_a_wait_cancelled_as_its_event_is_set_is_cancelled() -> None:
    """Cancelled in the same turn as its event is set, a wait raises CancelledError (on
    Python 3.11 ``asyncio.wait_for`` returned instead: a loop around the wait, as the
    job runner's, then never stopped, and closing it hung)."""

    async def scenario() -> None:
        event = asyncio.Event()
        waiting = asyncio.ensure_future(SystemClock().wait(event, 10.0))
        await asyncio.sleep(0)  # it waits
        event.set()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(scenario())
