"""What a node holds for one function: its routing and the schedulers of its versions.

The registry keeps one :class:`ServedFunction` per function it serves and is the
only one to change it; the reads of it live here: which version a request goes
to (:meth:`ServedFunction.choose`), the version listing, the kept failures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fnrt.functions.headers import STICKY_HEADER
from fnrt.functions.routing import Routing
from fnrt.functions.version import VersionManifest
from fnrt.runtime.scheduler import Scheduler
from fnrt.runtime.traffic import bucket_of, choose_version


@dataclass(eq=False)
class ServedFunction:
    """A function on this node."""

    name: str
    routing: Routing
    etag: str
    schedulers: dict[str, Scheduler] = field(default_factory=dict)  # by version id
    left_at: dict[str, float] = field(default_factory=dict)  # version -> lost its traffic

    @property
    def primary(self) -> Scheduler:
        return self.schedulers[self.routing.primary]

    def choose(self, headers: Mapping[str, str] | None = None) -> Scheduler:
        """The scheduler that answers a request with ``headers``, by the traffic split.

        The request's sticky key picks the version (one user, one version): the
        header the primary version's manifest names in ``sticky_header``, else
        ``x-fnrt-sticky`` (what ``fnrt.client`` sends); without one, a random draw.
        """
        traffic = self.routing.traffic
        if len(traffic) == 1:
            return self.primary
        key = None
        if headers is not None:
            sticky = self.primary.version.manifest.rollout.sticky_header
            key = headers.get(sticky.lower()) if sticky else None
            key = key or headers.get(STICKY_HEADER)
        return self.schedulers[choose_version(traffic, bucket_of(key))]

    def listing(
        self, manifests: Mapping[str, VersionManifest], now: float, rollout: Any = None
    ) -> dict[str, Any]:
        """``manifests`` (every stored version) with share, state here and breaker;
        ``rollout``: the one under way or last finished (the deployer's view of it)."""
        window = self.primary.version.manifest.rollout.rollback_window_s
        rows = []
        for version, vm in sorted(manifests.items(), key=lambda kv: kv[1].created_at):
            scheduler = self.schedulers.get(version)
            row: dict[str, Any] = {
                "version": version,
                "created_at": vm.created_at,
                "share": self.routing.traffic.get(version, 0),
                "state": scheduler.pool.state.value if scheduler is not None else "cold",
                "requests": scheduler.stats.requests if scheduler is not None else 0,
                "breaker": (
                    scheduler.protection.breaker.state.value if scheduler is not None else "closed"
                ),
            }
            if version in self.left_at:
                row["rollback_window_left_s"] = round(
                    max(window - (now - self.left_at[version]), 0.0), 1
                )
            rows.append(row)
        return {
            "name": self.name,
            "traffic": dict(self.routing.traffic),
            "previous": list(self.routing.previous),
            "rollout": rollout,
            "versions": rows,
        }

    def failures(self, version: str | None = None) -> list[dict[str, Any]]:
        """The kept failed requests (one version's, or all), newest first."""
        out: list[dict[str, Any]] = []
        for scheduler in self.schedulers.values():
            if version is not None and scheduler.version.version != version:
                continue
            for failure in scheduler.protection.failures:
                out.append(
                    {
                        "version": scheduler.version.version,
                        "at_unix_s": round(failure.at_unix_s, 3),
                        "error": failure.error,
                        "inputs": failure.inputs,  # None: too large to keep
                        "inputs_bytes": failure.inputs_bytes,
                    }
                )
        out.sort(key=lambda f: float(f["at_unix_s"]), reverse=True)
        return out


class Rollbacks:
    """The functions keeping a version warm for a rollback (a ``left_at``), noted by the
    registry as their routing changes: the sweep reads them without a look at every
    function it serves."""

    def __init__(self, served: Mapping[str, ServedFunction]) -> None:
        self._served = served  # the registry's table: only its current entries count
        self._names: set[str] = set()

    def note(self, entry: ServedFunction) -> None:
        if self._served.get(entry.name) is not entry:
            return  # an entry forgotten meanwhile (and served again): not the table's
        if entry.left_at:
            self._names.add(entry.name)
        else:
            self._names.discard(entry.name)

    def forget(self, name: str) -> None:
        self._names.discard(name)

    def names(self) -> set[str]:
        return set(self._names)
