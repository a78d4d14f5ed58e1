"""The deployer's record of rollouts: what the views show, and stopping canaries (the
record alone, and a node that closes with a canary under way; no server)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fnrt.functions.routing import Routing
from fnrt.runtime.rollout import RolloutPolicy, RolloutState, RolloutStatus
from fnrt.runtime.rollouts import Rollouts
from support import ECHO_MANIFEST, make_node, publish, write_function


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


def test_closing_the_node_stops_a_canary_under_way(tmp_path: Path) -> None:
    """Node.close stops canaries (the deployer's) before the registry closes the
    versions they walk between."""

    async def scenario() -> None:
        node = make_node(tmp_path, isolation="thread")
        first = write_function(tmp_path / "v1", "f")
        await node.deployer.deploy(publish(node.repository, first))
        canary_manifest = ECHO_MANIFEST + '\n[rollout]\npolicy = "canary"\ndwell_s = 3600\n'
        second = write_function(tmp_path / "v2", "f", manifest=canary_manifest)
        deployed = await node.deployer.deploy(publish(node.repository, second))
        assert deployed.rollout == "canary"
        canary = node.deployer.rollouts.of("f").canary
        assert canary is not None and canary.task is not None and not canary.task.done()
        await node.close(timeout_s=1.0)
        assert canary.task.done() and canary.status.state is RolloutState.STOPPED
        assert canary.status.reason == "the server is stopping"

    asyncio.run(scenario())
