"""The runtime side of pre-warming: histories fed by invocations, plans acted on.

Every invoke counts into its function's current minute (a dict update);
when the minute changes the count goes into the function's
:class:`~fnrt.runtime.prewarm.history.History`. After a function goes idle,
its policy's :class:`~fnrt.runtime.prewarm.policies.Plan` (the same
functions ``fnrt simulate`` runs) sets how long the instance stays loaded,
or unloads it and says when to load it again ahead of the predicted call.
Histories are saved as JSON in the cache folder, so a restart does not
forget them: once a minute the event loop copies the histories that changed
since the last save (:meth:`Keeper.snapshot`, a few microseconds each) and a
thread writes the file, each history's JSON kept from the save before unless
it changed. Times are wall-clock minutes from an injectable clock.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fnrt.loader.stores.file import write_atomic
from fnrt.runtime.prewarm.history import History
from fnrt.runtime.prewarm.policies import (
    Plan,
    Policy,
    PolicyConfig,
    Worth,
    decide,
    filling,
    fills,
    node_mean_gb,
    scarce,
    weigh,
    worth,
)

log = logging.getLogger("fnrt.prewarm")

#: Histories kept, most recently used first; older ones are dropped (bounded memory).
MAX_FUNCTIONS = 10_000


@dataclass
class _Live:
    """A function's invocations in the current minute, not yet in its history."""

    minute: int
    count: int


@dataclass(frozen=True)
class Action:
    """What the keeper wants done for a function now."""

    unload: bool = False
    prewarm: bool = False
    why: str = ""  # an unload's reason: "plan" (early, loaded again ahead) or "idle"


@dataclass(frozen=True)
class Snapshot:
    """The histories changed since the snapshot before, as they were at one moment
    (:meth:`Keeper.snapshot`), numbered; None for one forgotten meanwhile."""

    taken: int
    histories: dict[str, History | None]


#: Forgotten functions remembered by the writer (so that an earlier snapshot written
#: late does not bring one back), at most; the oldest half goes past it.
MAX_FORGOTTEN = 4096


class Keeper:
    """Histories and plans of every function a node serves."""

    def __init__(
        self,
        path: Path | None = None,
        config: PolicyConfig | None = None,
        wall: Callable[[], float] = time.time,
        *,
        fill_memory: bool | None = False,
    ) -> None:
        self.path = path
        self.config = config or PolicyConfig()
        self.wall = wall
        #: keep instances past their plans while the memory budget has room (planned at
        #: FILL_PRICE_FACTOR the price): always (True), never (False), or each plan as
        #: :func:`~fnrt.runtime.prewarm.policies.fills` says (None: a node given a budget)
        self.fill_memory = fill_memory
        self._filling: dict[str, bool] = {}  # each plan's: does it fill the budget
        self.histories: dict[str, History] = {}
        self._live: dict[str, _Live] = {}
        #: every function with a history or a call this minute, least recently called
        #: first (moved last at its first call of a minute): the one dropped for room
        #: in O(1), not by a scan of up to MAX_FUNCTIONS on the request path
        self._recency: dict[str, None] = {}
        self._prewarm_at: dict[str, float] = {}  # unix time of a planned pre-warm
        self._unload_after: dict[str, float] = {}  # unix time the plan releases it
        self._plans: dict[
            str, tuple[tuple[Policy, int, int, float, PolicyConfig, int | None], Plan]
        ] = {}
        self._priced: dict[tuple[float | None, float | None], PolicyConfig] = {}
        self._fixed: set[str] = set()  # kept by the manifest's keep_alive_s: nothing to plan
        self._sizes: dict[str, float] = {}  # each planned function's instance, GB
        # their mean as the price's unit, made again only when a size changes, and the
        # config last priced at it: the sweep asks every second of every function with
        # a plan pending (a sum over all sizes each time: 56 us a plan at 10,000)
        self._mean_gb: float | None = None
        # the working set's parts, kept as calls come: each sized function's last call
        # minute, and their instances' bytes by that minute (a plan's working set was a
        # scan of every function: 2.9 ms a plan at 10,000)
        self._last_of: dict[str, tuple[int, int]] = {}  # (minute, bytes counted)
        self._bytes_by_minute: dict[int, int] = {}
        self._newest_minute = 0  # the latest minute counted
        self._at_mean: tuple[PolicyConfig, float, PolicyConfig] | None = None
        self._worth: dict[str, tuple[Plan, Worth, Worth]] = {}  # plan's, and kept past it
        self._priced_as: dict[str, PolicyConfig] = {}  # each plan's config: filling, scarce
        self._taken = 0  # the last snapshot's number
        self._changed: set[str] = set()  # histories changed (or forgotten) since then
        # the writer's: each function's JSON as last written, the snapshot it came
        # from, and the functions forgotten (with theirs); under _writing
        self._fragments: dict[str, bytes] = {}
        self._fragment_taken: dict[str, int] = {}
        self._unwritten: bytes | None = None  # the file as read at the start, to be kept
        self._forgotten: dict[str, int] = {}
        self._writing = threading.Lock()
        if path is not None and path.is_file():
            self._load(path)

    # --- recording (the request path) ----------------------------------------------

    def invoked(self, name: str) -> None:
        """One invocation of ``name`` now."""
        minute = int(self.wall() // 60)
        live = self._live.get(name)
        if live is not None and live.minute == minute:
            live.count += 1
            return
        if live is not None:
            self._commit(name, live)
        self._live[name] = _Live(minute, 1)
        counted = self._last_of.get(name)
        if counted is not None:  # (a clock stepped back never moves it back)
            self._called_in(name, max(minute, counted[0]))
        recency = self._recency
        recency.pop(name, None)
        recency[name] = None
        self._prewarm_at.pop(name, None)
        self._unload_after.pop(name, None)

    def _settle(self, name: str) -> None:
        """Commit ``name``'s calls of a past minute to its history (those of the current
        minute wait for its end: a minute goes in once, whole)."""
        live = self._live.get(name)
        if live is not None and live.minute < int(self.wall() // 60):
            del self._live[name]
            self._commit(name, live)

    def _commit(self, name: str, live: _Live) -> None:
        history = self.histories.get(name)
        if history is None:
            if len(self.histories) >= MAX_FUNCTIONS:  # drop the least recently called
                self._forget(next(n for n in self._recency if n in self.histories))
            history = self.histories[name] = History()
            self._recency.setdefault(name, None)
        history.record(live.minute, live.count)
        self._changed.add(name)

    def forget(self, name: str) -> None:
        """``name`` was deleted: its history, its plan and its calls not yet committed
        go (deployed again, it is learned afresh), and the next save leaves it out."""
        self._live.pop(name, None)
        self._forget(name)

    def _forget(self, name: str) -> None:
        """Drop all that is kept of ``name``: its history and its plan with it (a plan
        left behind would keep the sweep looking at a function it knows nothing of)."""
        for kept in (
            self.histories,
            self._prewarm_at,
            self._unload_after,
            self._plans,
            self._filling,
            self._sizes,
            self._worth,
            self._priced_as,
        ):
            kept.pop(name, None)
        self._fixed.discard(name)
        if name not in self._live:  # (a call of its own still to commit keeps its place)
            self._recency.pop(name, None)
        self._mean_gb = None
        self._unsized(name)
        self._changed.add(name)

    # --- deciding (the sweep) ----------------------------------------------------------

    def priced(self, gb_s: float | None, s: float | None) -> PolicyConfig:
        """The node's policy config with a function's own price of a cold start (its
        manifest's ``cold_start_price_gb_s`` or ``cold_start_price_s``), if it sets one."""
        if gb_s is None and s is None:
            return self.config
        key = (gb_s, s)
        config = self._priced.get(key)
        if config is None:
            config = replace(
                self.config,
                cold_start_price_gb_s=self.config.cold_start_price_gb_s if gb_s is None else gb_s,
                cold_start_price_s=s,
            )
            self._priced[key] = config
        return config

    def mean_instance_gb(self) -> float:
        """The mean instance of the functions planned for (``auto``'s unit of price), to
        two significant digits (a plan is not made again for a small change of it)."""
        mean = self._mean_gb
        if mean is None:
            sizes = self._sizes
            mean = self._mean_gb = node_mean_gb(sum(sizes.values()), len(sizes))
        return mean

    def at_mean(self, config: PolicyConfig) -> PolicyConfig:
        """``config`` priced at the node's mean instance, unless it names its own."""
        if config.mean_instance_gb is not None:
            return config
        mean = self.mean_instance_gb()
        last = self._at_mean
        if last is not None and last[0] is config and last[1] == mean:
            return last[2]  # the same object: the plan's cache key compares at once
        priced = replace(config, mean_instance_gb=mean)
        self._at_mean = (config, mean, priced)
        return priced

    def plan(
        self,
        name: str,
        policy: Policy,
        *,
        memory_gb: float = 1.0,
        config: PolicyConfig | None = None,
        budget_bytes: int | None = None,
    ) -> Plan | None:
        """The plan after ``name``'s last call for an instance of ``memory_gb`` (at
        ``config``'s price, default the node's), or None when it was never called.
        ``budget_bytes``: the node's memory budget, which a plan may fill (made once
        after each call: whether it fills is decided then, :meth:`filling`); an ``auto``
        plan that does not, made while the working set is over the budget, is made at
        the share of it the budget holds times the price
        (:func:`~fnrt.runtime.prewarm.policies.scarce`), as ``fnrt simulate`` makes it."""
        self._settle(name)
        history = self.histories.get(name)
        if history is None or history.last_minute is None:
            return None
        if self._sizes.get(name) != memory_gb:  # (_called_in moves the bytes counted)
            self._sizes[name] = memory_gb
            self._mean_gb = None
            live = self._live.get(name)
            last = history.last_minute
            self._called_in(name, last if live is None else max(last, live.minute))
        given = config or self.config
        key = (policy, history.invocations, history.last_minute, memory_gb, given, budget_bytes)
        cached = self._plans.get(name)
        if cached is not None and cached[0] == key:
            # nothing new since: the same plan (the sweep asks every second). The node's
            # mean instance moves as functions join; a plan is made once after a call at
            # the mean then, as ``fnrt simulate`` makes it
            return cached[1]
        config = self.at_mean(given)
        fill = self.fill_memory
        working_set = None
        if fill is None:
            working_set = self.working_set_bytes(history.last_minute)
            fill = policy is Policy.AUTO and fills(working_set, budget_bytes)
        self._filling[name] = fill
        if fill:
            config = filling(config)
        elif policy is Policy.AUTO and budget_bytes is not None:  # scarcer while it is short
            if working_set is None:
                working_set = self.working_set_bytes(history.last_minute)
            config = scarce(config, working_set, budget_bytes)
        plan = decide(policy, config, history, history.last_minute, memory_gb)
        self._plans[name] = (key, plan)
        self._priced_as[name] = config
        return plan

    def filling(self, name: str) -> bool:
        """Whether ``name``'s plan fills the memory budget: its instance is kept past the
        plan while the budget has room, and its pre-warm may evict those worth less."""
        return self._filling.get(name, bool(self.fill_memory))

    def working_set_bytes(self, minute: int) -> float:
        """What a fixed keep-alive of ``keep_alive_min`` would hold after ``minute``: the
        instances of the functions called in it or in the ``keep_alive_min`` minutes
        before, or since (as last loaded, the planned ones), in bytes. From the bytes
        kept by last call minute: a look at a few minutes, whatever the functions."""
        since = minute - self.config.keep_alive_min
        by_minute = self._bytes_by_minute
        newest = self._newest_minute
        if newest - since < len(by_minute):  # the minutes since, one look each
            return float(sum(by_minute.get(m, 0) for m in range(since, newest + 1)))
        return float(sum(b for m, b in by_minute.items() if m >= since))

    def _called_in(self, name: str, minute: int) -> None:
        """``name``'s (sized) last call is now in ``minute``: its bytes are counted there."""
        self._unsized(name)
        size = int(self._sizes[name] * 2**30)
        self._last_of[name] = (minute, size)
        by_minute = self._bytes_by_minute
        by_minute[minute] = by_minute.get(minute, 0) + size
        if minute > self._newest_minute:
            self._newest_minute = minute

    def _unsized(self, name: str) -> None:
        """``name``'s bytes no longer counted (forgotten, sized again, or moving)."""
        counted = self._last_of.pop(name, None)
        if counted is not None:
            minute, size = counted
            by_minute = self._bytes_by_minute
            left = by_minute.get(minute, 0) - size
            if left > 0:
                by_minute[minute] = left
            else:  # (one of 0 bytes may find its minute gone already)
                by_minute.pop(minute, None)

    def act(
        self,
        name: str,
        policy: Policy,
        *,
        keep_alive_s: float,
        idle_since_unix: float,
        loaded: bool,
        memory_gb: float = 1.0,
        config: PolicyConfig | None = None,
        lead_s: float = 60.0,
        budget_bytes: int | None = None,
    ) -> Action:
        """What to do now with an idle function: unload, pre-warm, or nothing.

        With ``fixed``, ``keep_alive_s`` (the manifest's) is the plan. Other
        policies plan in minutes from the last call; ``auto`` weighs the memory of
        an instance (``memory_gb``) against ``config``'s price of a cold start. A
        pre-warm starts ``lead_s`` before the plan's first minute (the time a load
        takes, with a margin), so the memory it holds is what the plan priced.
        """
        now = self.wall()
        live = self._live.get(name)
        if live is not None and live.minute >= int(now // 60):
            return Action()  # still being called this minute
        if policy is Policy.FIXED:
            self._settle(name)  # its minute is over: into the history, nothing pending
            self._fixed.add(name)
            return Action(unload=loaded and now - idle_since_unix >= keep_alive_s, why="idle")
        self._fixed.discard(name)
        plan = self.plan(
            name, policy, memory_gb=memory_gb, config=config, budget_bytes=budget_bytes
        )
        if plan is None or plan.why.startswith("fixed"):  # not enough known: the manifest's
            return Action(unload=loaded and now - idle_since_unix >= keep_alive_s, why="idle")
        history = self.histories[name]
        last = (history.last_minute or 0) * 60.0
        first, end = plan.loaded  # minutes after the last call's minute with it loaded
        load_from = last + first * 60.0 - lead_s  # loaded as the plan's first minute begins
        unload_at = last + (end + 1) * 60.0
        if plan.prewarm_after_min > 0:  # a pre-warm to come: the sweep must look
            self._prewarm_at[name] = load_from
        else:  # kept from the call: once unloaded, nothing to do until the next one
            self._prewarm_at.pop(name, None)
        self._unload_after[name] = unload_at
        if loaded:
            early = plan.prewarm_after_min > 0 and now < load_from  # unload now, back later
            return Action(unload=early or now >= unload_at, why="plan" if early else "idle")
        # Load ahead only for a predicted call: an instance unloaded by hand (or evicted)
        # under a keep-loaded plan stays unloaded until it is called.
        return Action(prewarm=plan.prewarm_after_min > 0 and load_from <= now < unload_at)

    def weigh(
        self,
        name: str,
        policy: Policy,
        *,
        memory_gb: float = 1.0,
        config: PolicyConfig | None = None,
        ahead: bool = False,
        budget_bytes: int | None = None,
    ) -> tuple[float, bool]:
        """What keeping ``name``'s loaded instance is worth now, and whether it must stay
        (:func:`~fnrt.runtime.prewarm.policies.weigh`, as ``fnrt simulate`` weighs it);
        past its plan, when the plan fills the budget (:meth:`filling`), a worth below
        every planned one; ``ahead``: what a pre-warm's instance will be worth as its
        window opens."""
        plan = self.plan(
            name, policy, memory_gb=memory_gb, config=config, budget_bytes=budget_bytes
        )
        history = self.histories.get(name)
        if plan is None or history is None or history.last_minute is None:
            return 0.0, False
        kept = self.filling(name)
        cached = self._worth.get(name)
        if cached is None or cached[0] is not plan:
            priced = self._priced_as[name]  # the plan's own price
            cached = (
                plan,
                worth(priced, history, plan, memory_gb),
                worth(priced, history, plan, memory_gb, cached=True),
            )
            self._worth[name] = cached
        if ahead:
            return cached[1].at(cached[1].first - 1), False
        live = self._live.get(name)  # called this minute: idle 0 (its minute not in yet)
        last = history.last_minute if live is None else live.minute
        idle_min = int(self.wall() // 60) - last
        return weigh(cached[1], idle_min, cached[2] if kept else None)

    def knows(self, name: str) -> bool:
        """Whether ``name`` has a history (a node serves it from the start, so the sweep
        can pre-warm it ahead of its next call)."""
        return name in self.histories or name in self._live

    def pending(self, name: str) -> bool:
        """Whether the sweep must look at ``name`` although it is cold: a pre-warm is
        planned, or it has a history no plan has been made from yet."""
        if name in self._prewarm_at or name in self._live:
            return True
        return name in self.histories and name not in self._plans and name not in self._fixed

    def pending_names(self) -> set[str]:
        """Every function :meth:`pending` is true of, from the sets of names alone."""
        unplanned = self.histories.keys() - self._plans.keys() - self._fixed
        return self._prewarm_at.keys() | self._live.keys() | unplanned

    def planned(self, name: str) -> dict[str, Any]:
        """The pending plan of ``name`` (unix times), for describe."""
        out: dict[str, Any] = {}
        if name in self._prewarm_at:
            out["prewarm_at_unix_s"] = round(self._prewarm_at[name], 1)
        if name in self._unload_after:
            out["unload_after_unix_s"] = round(self._unload_after[name], 1)
        history = self.histories.get(name)
        if history is not None:
            out["idle_samples"] = history.samples
        cached = self._plans.get(name)
        if cached is not None and name not in self._fixed:
            plan = cached[1]
            out["why"] = plan.why  # the rule that decided: cost, forecast, time of day...
            first, last = plan.loaded
            out["plan"] = (
                f"loaded minutes {first}-{last} after the last call"
                + (" (unloaded at once, pre-warmed ahead)" if plan.prewarm_after_min else "")
                if last >= first
                else "unloaded at once"
            )
        return out

    # --- persistence ------------------------------------------------------------------

    def save(self) -> None:
        """Write every history (atomically) so a restart keeps them: :meth:`snapshot`
        and :meth:`write` on one thread (a caller off the event loop that records calls
        takes the snapshot there, and writes it on another)."""
        self.write(self.snapshot())

    def snapshot(self) -> Snapshot:
        """A copy of each history changed since the last snapshot, and of each with calls
        in the minute so far (which its history in memory takes only when the minute
        ends: recorded into the copy): taken on the thread that records calls, so that
        no history changes while it is read. Its cost follows the functions called
        since, not all those known (copying all 10,000 a node keeps took the event
        loop 0.12 s a minute). Calls of minutes that are over are settled first (the sweep
        settles only the functions it plans for), so none is copied again and again."""
        minute = int(self.wall() // 60)
        for name in [n for n, now in self._live.items() if now.minute < minute]:
            self._settle(name)
        changed, self._changed = self._changed, set()
        histories, live = self.histories, self._live
        kept: dict[str, History | None] = {}
        for name in changed.union(live):
            history = histories.get(name)
            now = live.get(name)
            if history is None and now is None:
                kept[name] = None  # forgotten
                continue
            copied = history.copy() if history is not None else History()
            if now is not None:
                copied.record(now.minute, now.count)
            kept[name] = copied
        self._taken += 1
        return Snapshot(self._taken, kept)

    def write(self, snapshot: Snapshot) -> None:
        """Write every history known with ``snapshot``'s changes (atomically), from any
        thread. A function's JSON is made again only when it changed; one changed in a
        later snapshot already written keeps the later one (a save still running when
        the node stops, and the stop's own)."""
        if self.path is None:
            return
        with self._writing:
            fragments, taken_at, forgotten = self._fragments, self._fragment_taken, self._forgotten
            if self._unwritten is not None:  # the first write: the histories read at start
                read = json.loads(self._unwritten).get("functions", {})
                for name, raw in read.items():
                    fragments.setdefault(str(name), _fragment(str(name), raw))
                self._unwritten = None
            for name, history in snapshot.histories.items():
                if max(taken_at.get(name, 0), forgotten.get(name, 0)) > snapshot.taken:
                    continue  # a later snapshot's is written already
                if history is None:
                    fragments.pop(name, None)
                    taken_at.pop(name, None)
                    forgotten[name] = snapshot.taken
                    continue
                forgotten.pop(name, None)
                taken_at[name] = snapshot.taken
                fragments[name] = _fragment(name, history.to_dict())
            if len(forgotten) > MAX_FORGOTTEN:  # the oldest half, never this snapshot's
                oldest = sorted(forgotten, key=forgotten.__getitem__)[: len(forgotten) // 2]
                for name in oldest:
                    if forgotten[name] < snapshot.taken - 1:
                        del forgotten[name]
            write_atomic(
                self.path,
                [b'{"version": 1, "functions": {', b", ".join(fragments.values()), b"}}"],
            )

    def _load(self, path: Path) -> None:
        try:
            text = path.read_bytes()
            data = json.loads(text)
            for name, raw in dict(data.get("functions", {})).items():
                self.histories[str(name)] = History.from_dict(raw)
            histories = self.histories  # (names sorted, no tuple a history: the collector)
            self._recency = dict.fromkeys(
                sorted(histories, key=lambda name: histories[name].last_minute or 0)
            )
            # what the first write keeps of each unless it changed: read again and made
            # into JSON there, on the writer's thread (here it would slow a node's start;
            # the parsed file kept till then, the collector's every pass)
            self._unwritten = text
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("ignoring unreadable pre-warm history %s: %s", path, exc)
            self.histories = {}
            self._unwritten = None
            self._recency = {}


def _fragment(name: str, history: Any) -> bytes:
    """One function's entry in the saved file: its name and its history, as JSON."""
    return b"%s: %s" % (json.dumps(name).encode(), json.dumps(history).encode())
