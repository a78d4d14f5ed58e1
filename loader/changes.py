"""The store-wide change feed: one small object that says which functions moved.

Every routing change (deploy, traffic, rollback, delete), through any node or
``fnrt deploy --store``, also appends the function's name to ``changes.json``
with a conditional write. A node polls that one object with ``If-None-Match``
(a 304 while nothing moved), so watching the store costs one request per poll
interval whatever the number of functions; on a change it re-reads the routing
of the functions named, and only those.

The feed keeps the last ``FEED_LENGTH`` changes. A node that fell further
behind (asleep, or cut off from the store) cannot tell what moved from the
feed alone, so it re-reads every function it serves, once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: The feed's key in the store.
FEED_KEY = "changes.json"

#: Changes kept; a node more than this many behind re-reads everything it serves.
FEED_LENGTH = 512


@dataclass(frozen=True)
class Change:
    """One routing change: the feed's generation after it, and the function."""

    generation: int
    name: str
    at: str  # ISO time of the write (informational)


@dataclass(frozen=True)
class Feed:
    """The feed as read: its generation (changes ever made) and the latest changes."""

    generation: int = 0
    changes: tuple[Change, ...] = ()

    def since(self, seen: int) -> list[str] | None:
        """Functions changed after generation ``seen``, each once, in order of
        change; None when the feed no longer reaches back that far (or it was
        reset: a generation below ``seen``)."""
        if seen == self.generation:
            return []
        oldest = self.changes[0].generation if self.changes else self.generation + 1
        if seen > self.generation or seen < oldest - 1:
            return None
        return list(dict.fromkeys(c.name for c in self.changes if c.generation > seen))

    def appended(self, name: str, at: str) -> Feed:
        """The feed after one more change to ``name``, trimmed to ``FEED_LENGTH``."""
        generation = self.generation + 1
        changes = (*self.changes, Change(generation, name, at))[-FEED_LENGTH:]
        return Feed(generation, changes)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "generation": self.generation,
                "changes": [[c.generation, c.name, c.at] for c in self.changes],
            },
            separators=(",", ":"),
        ).encode()

    @staticmethod
    def from_json(data: bytes) -> Feed:
        raw: Any = json.loads(data)
        changes = tuple(Change(int(g), str(n), str(a)) for g, n, a in raw["changes"])
        return Feed(int(raw["generation"]), changes)
