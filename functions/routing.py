"""Which versions of a function get traffic: the content of ``routing.json``."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from fnrt.functions.errors import Conflict, FnrtError

#: How many earlier versions a routing file remembers for rollback.
HISTORY_LIMIT = 20


@dataclass(frozen=True)
class Routing:
    """Traffic shares by version (percent, summing to 100) and the versions before."""

    traffic: Mapping[str, int]
    previous: tuple[str, ...] = ()
    updated_at: str = ""
    #: While traffic is split (a canary, a hand-set split): the version that had all of
    #: it before the split began, where a rollback returns ("": none)
    source: str = ""

    def __post_init__(self) -> None:
        if not self.traffic:
            raise ValueError("traffic must name at least one version")
        if any(not 0 <= p <= 100 for p in self.traffic.values()):
            raise ValueError("traffic shares are percentages from 0 to 100")
        if sum(self.traffic.values()) != 100:
            raise ValueError(f"traffic shares must sum to 100, got {dict(self.traffic)}")

    @functools.cached_property
    def primary(self) -> str:
        """The version with the largest share (the newest on a tie); worked out once
        (a routing is a value, and every request asks)."""
        return max(reversed(list(self.traffic)), key=lambda v: self.traffic[v])

    def cut_over(self, version: str, now_iso: str) -> Routing:
        """All traffic to ``version``; the versions that had traffic go to history."""
        before = [v for v in self.traffic if v != version]
        history = [*before, *(v for v in self.previous if v not in before and v != version)]
        return replace(
            self,
            traffic={version: 100},
            previous=tuple(history[:HISTORY_LIMIT]),
            updated_at=now_iso,
            source="",
        )

    def with_traffic(self, traffic: Mapping[str, int], now_iso: str) -> Routing:
        """A hand-set (or canary) split; versions that lose all traffic go to history."""
        shares = {v: p for v, p in traffic.items() if p > 0}
        routing = Routing(traffic=shares, updated_at=now_iso)
        # The version that was primary stays first in history while it is not primary
        # (a rollback returns to it), then the versions that lost all traffic.
        head = [self.primary] if self.primary != routing.primary else []
        gone = [v for v in self.traffic if v not in shares and v not in head]
        history = [*head, *gone]
        history += [v for v in self.previous if v not in history and v != routing.primary]
        source = ""
        if len(shares) > 1:  # a split: it began from this one's only version, or its source
            source = self.primary if len(self.traffic) == 1 else self.source
        return replace(routing, previous=tuple(history[:HISTORY_LIMIT]), source=source)

    def rolled_back(self, now_iso: str) -> Routing:
        """All traffic back to the version it had before: while a split is under way, the
        one the split began from (the others leave no history: a canary rolled back);
        else the newest version in history. FnrtError if there is none."""
        if len(self.traffic) > 1 and self.source in self.traffic:
            others = set(self.traffic) - {self.source}
            history = [v for v in self.previous if v not in others and v != self.source]
            return Routing({self.source: 100}, tuple(history), now_iso)
        if not self.previous:
            raise Conflict("there is no earlier version to roll back to")
        return self.cut_over(self.previous[0], now_iso)

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "traffic": dict(self.traffic),
            "previous": list(self.previous),
            "updated_at": self.updated_at,
        }
        if self.source:
            doc["source"] = self.source
        return json.dumps(doc, indent=2).encode()

    @staticmethod
    def first(version: str, now_iso: str) -> Routing:
        return Routing(traffic={version: 100}, updated_at=now_iso)

    @staticmethod
    def from_json(data: bytes) -> Routing:
        try:
            raw: dict[str, Any] = json.loads(data)
            return Routing(
                traffic={str(k): int(v) for k, v in raw["traffic"].items()},
                previous=tuple(str(v) for v in raw.get("previous", [])),
                updated_at=str(raw.get("updated_at", "")),
                source=str(raw.get("source", "")),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise FnrtError(f"routing file is malformed: {exc}") from None
