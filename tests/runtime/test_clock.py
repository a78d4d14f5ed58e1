from __future__ import annotations

import asyncio

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
