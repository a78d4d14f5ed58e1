"""The rollouts of the functions a node serves: the canary under way, the last one done.

These are the deployer's alone: it starts and ends rollouts and is the only one
to write them; the admin views read them (:meth:`Rollouts.view`). The function
table (routing, the schedulers of versions) is the registry's: a rollout moves
traffic by asking it (``Registry.write``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fnrt.functions.routing import Routing
from fnrt.runtime.rollout import Canary, RolloutStatus


@dataclass
class Rollout:
    """One function's rollouts on this node."""

    canary: Canary | None = None  # under way
    last: RolloutStatus | None = None  # under way or last finished


class Rollouts:
    """Every function's rollouts on this node, by name."""

    def __init__(self) -> None:
        self._by_name: dict[str, Rollout] = {}

    def of(self, name: str) -> Rollout:
        """``name``'s rollouts (none yet: an empty record, kept)."""
        rollout = self._by_name.get(name)
        if rollout is None:
            rollout = self._by_name[name] = Rollout()
        return rollout

    def view(self, name: str, routing: Routing) -> dict[str, Any] | None:
        """The rollout under way or last finished, as ``describe`` and ``versions`` show
        it, against the routing served now: a finished rollout whose version has no
        traffic now (rolled back on another node, or a split set by hand since) says
        so, rather than a stale "done"."""
        rollout = self._by_name.get(name)
        if rollout is None or rollout.last is None:
            return None
        last = rollout.last
        view = last.to_dict()
        if view["state"] == "done" and not routing.traffic.get(last.to, 0):
            view["state"] = "superseded"
            shares = ", ".join(f"{v} {p}%" for v, p in routing.traffic.items())
            view["reason"] = f"traffic has moved off it since: {shares}"
        return view

    async def forget(self, name: str, why: str) -> None:
        """Stop ``name``'s canary, if one is under way (``why``), and forget its rollouts."""
        rollout = self._by_name.pop(name, None)
        if rollout is not None and rollout.canary is not None:
            await rollout.canary.cancel(why)

    async def close(self) -> None:
        """Stop every canary under way: the server is stopping."""
        for name in list(self._by_name):
            await self.forget(name, "the server is stopping")
