"""The deployer's record of rollouts alone: what the views show, and stopping canaries."""

from __future__ import annotations

import asyncio

from fnrt.functions.routing import Routing
from fnrt.runtime.rollout import RolloutPolicy, RolloutState, RolloutStatus
from fnrt.runtime.rollouts import Rollouts


class Stoppable:
    """A canary as the record stops it."""

    def __init__(self) -> None:
        self.why: list[str] = []

    async def cancel(self, why: str) -> None:
        self.why.append(why)


def test_a_done_rollout_whose_version_lost_its_traffic_is_superseded() -> None:
    rollouts = Rollouts()
    routed = Routing({"v-2": 100})
    assert rollouts.view("f", routed) is None  # nothing rolled out here
    rollouts.of("f").last = RolloutStatus(RolloutPolicy.IMMEDIATE, "v-2", RolloutState.DONE)
    assert rollouts.view("f", routed)["state"] == "done"  # type: ignore[index]
    moved = rollouts.view("f", Routing({"v-1": 90, "v-2": 10}))
    assert moved is not None and moved["state"] == "done"  # it still has a share
    gone = rollouts.view("f", Routing({"v-1": 100}))
    assert gone is not None and gone["state"] == "superseded"
    assert gone["reason"] == "traffic has moved off it since: v-1 100%"


def test_forgetting_a_function_or_closing_stops_its_canary() -> None:
    async def scenario() -> None:
        rollouts = Rollouts()
        deleted, running = Stoppable(), Stoppable()
        rollouts.of("a").canary = deleted  # type: ignore[assignment]
        rollouts.of("b").canary = running  # type: ignore[assignment]
        await rollouts.forget("a", "the function was deleted")
        assert deleted.why == ["the function was deleted"] and running.why == []
        assert rollouts.view("a", Routing({"v": 100})) is None
        await rollouts.close()
        assert running.why == ["the server is stopping"] and deleted.why == [
            "the function was deleted"
        ]

    asyncio.run(scenario())
