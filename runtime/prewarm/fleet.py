"""Replay a trace over a fleet of nodes: how routing decides cold starts, fetches and memory.

Each node has its own L1 memory budget (loaded instances) and L2 disk budget
(the model files it fetched), and runs the keep-alive/pre-warm policy the
server runs, on the calls it sees (its own :class:`History` per function).
Minute by minute, the calls of each function are routed:

- ``hash``: every call of a function to one node (rendezvous hashing: the
  node with the highest hash of the pair, as consistent as a ring);
- ``round_robin``: the calls spread evenly over the nodes, rotating;
- ``least_loaded``: the calls fill the nodes with the fewest calls this
  minute first (water-filling: a small function lands on the least-loaded
  node, a hot one spreads).

A call that finds its function loaded on its node is warm. Otherwise it is a
cold start from L2 (the files are on the node's disk) or L3 (fetched from the
store). Loading makes room in L1 as a node's memory budget does
(:func:`fnrt.loader.memory.evictions`, the server's decision): the instance
not called this minute worth least goes first, under ``auto`` each weighed by
its plan (:func:`~fnrt.runtime.prewarm.policies.weigh`; other policies: all
alike, the least recently called first), where plans are made without a
budget's filling or scarcity (:func:`~fnrt.runtime.prewarm.node.simulate_node`
models those for one node); the files stay in L2 until its budget evicts them
(least recently used). After a function's last call on a node, the policy's
plan says for which minutes it stays (or is pre-loaded) there; a pre-warm
only takes free memory. A function's memory and its files' size are its
app's average allocated memory (``--memory``), else ``default_memory_mb``.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from fnrt.loader.memory import Held, evictions
from fnrt.runtime.prewarm.history import History
from fnrt.runtime.prewarm.policies import Plan, Policy, PolicyConfig, Worth, decide, weigh, worth
from fnrt.runtime.prewarm.trace import Trace


class Routing(Enum):
    HASH = "hash"
    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"


@dataclass(frozen=True)
class FleetConfig:
    """The fleet: its size, how calls are routed, each node's budgets, the policy."""

    nodes: int
    routing: Routing = Routing.HASH
    memory_budget_mb: float = 32 * 1024.0  # L1 of each node
    disk_budget_mb: float = 200 * 1024.0  # L2 of each node
    default_memory_mb: float = 256.0  # a function whose memory the trace does not give
    policy: Policy = Policy.AUTO
    policy_config: PolicyConfig = field(default_factory=PolicyConfig)

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError("nodes: at least 1")
        if self.memory_budget_mb <= 0 or self.disk_budget_mb <= 0:
            raise ValueError("memory_budget_mb, disk_budget_mb: must be > 0")

    @property
    def label(self) -> str:
        return f"{self.routing.value}, {self.nodes} nodes"


@dataclass(frozen=True)
class FleetOutcome:
    """What a fleet did over a trace; per-node arrays are indexed by node."""

    config: FleetConfig
    invocations: int
    cold_l2: int  # cold starts whose files were on the node's disk
    cold_l3: int  # cold starts that fetched from the store
    prewarm_loads: int
    l3_fetches: int  # every fetch from the store: cold starts and pre-warms
    calls_by_node: np.ndarray
    memory_gb_min_by_node: np.ndarray  # memory held by loaded instances, summed per minute
    peak_memory_mb_by_node: np.ndarray
    evictions: int  # instances evicted for memory before their plan ended

    @property
    def cold_starts(self) -> int:
        return self.cold_l2 + self.cold_l3

    @property
    def cold_percent(self) -> float:
        return 100.0 * self.cold_starts / max(self.invocations, 1)

    @property
    def imbalance(self) -> float:
        """Calls of the busiest node over the mean (1.0: perfectly even)."""
        mean = float(self.calls_by_node.mean())
        return float(self.calls_by_node.max()) / mean if mean else 1.0

    @property
    def memory_gb_hours(self) -> float:
        return float(self.memory_gb_min_by_node.sum()) / 60.0

    def row(self) -> dict[str, str]:
        return {
            "routing": self.config.routing.value,
            "nodes": str(self.config.nodes),
            "cold %": f"{self.cold_percent:.3f}",
            "cold L2": f"{self.cold_l2:,}",
            "cold L3": f"{self.cold_l3:,}",
            "L3 fetches": f"{self.l3_fetches:,}",
            "memory GB-h": f"{self.memory_gb_hours:,.0f}",
            "peak node GB": f"{self.peak_memory_mb_by_node.max() / 1024:,.1f}",
            "imbalance": f"{self.imbalance:.2f}x",
        }


def rendezvous(function: str, nodes: int) -> int:
    """The node a function hashes to: the highest hash of (function, node)."""
    scores = [
        hashlib.blake2b(f"{function}\0{n}".encode(), digest_size=8).digest() for n in range(nodes)
    ]
    return max(range(nodes), key=scores.__getitem__)


def water_fill(loads: np.ndarray, calls: int) -> np.ndarray:
    """How many of ``calls`` each node takes so the least loaded fill up first."""
    n = len(loads)
    order = np.argsort(loads, kind="stable")
    ordered = loads[order].astype(np.float64)
    share = np.zeros(n, dtype=np.int64)
    # the level T with sum(max(0, T - load)) == calls, over the k lowest nodes
    prefix = np.cumsum(ordered)
    level = 0.0
    k = n
    for k in range(1, n + 1):
        level = (calls + prefix[k - 1]) / k
        if k == n or level <= ordered[k]:
            break
    raw = np.maximum(level - ordered[:k], 0.0)
    taken = np.floor(raw).astype(np.int64)
    for i in np.argsort(-(raw - taken), kind="stable")[: calls - int(taken.sum())]:
        taken[i] += 1
    share[order[:k]] = taken
    return share


@dataclass
class _Resident:
    """One function on one node."""

    history: History = field(default_factory=History)
    last: int = -1  # minute of the last call here
    plan: Plan | None = None  # decided after the last call of a run
    worth: Worth | None = None  # what keeping it is worth under ``plan`` (made with it)


class _Node:
    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.functions: dict[int, _Resident] = {}
        self.loaded: OrderedDict[int, None] = OrderedDict()  # L1, least recently used first
        self.memory_mb = 0.0
        self.files: OrderedDict[int, None] = OrderedDict()  # L2, least recently used first
        self.disk_mb = 0.0
        self.calls = 0
        self.memory_mb_min = 0.0
        self.peak_mb = 0.0

    def fetch(self, f: int, size_mb: float) -> bool:
        """Make sure ``f``'s files are on disk; True when they had to come from L3."""
        if f in self.files:
            self.files.move_to_end(f)
            return False
        self.files[f] = None
        self.disk_mb += size_mb
        return True

    def trim_disk(self, sizes: np.ndarray) -> None:
        while self.disk_mb > self.config.disk_budget_mb and len(self.files) > 1:
            f, _ = self.files.popitem(last=False)
            self.disk_mb -= sizes[f]

    def load(self, f: int, size_mb: float) -> None:
        self.loaded[f] = None
        self.memory_mb += size_mb

    def unload(self, f: int, size_mb: float) -> None:
        del self.loaded[f]
        self.memory_mb -= size_mb


class FleetSimulator:
    """Replays a trace over ``config.nodes`` nodes (see the module docstring)."""

    def __init__(self, trace: Trace, config: FleetConfig) -> None:
        self.trace = trace
        self.config = config
        memory = trace.memory_mb
        sizes = np.full(trace.counts.shape[0], config.default_memory_mb)
        if memory is not None:
            known = ~np.isnan(memory)
            sizes[known] = memory[known]
        self.sizes = sizes
        self.nodes = [_Node(config) for _ in range(config.nodes)]
        self.homes = [rendezvous(name, config.nodes) for name in trace.functions]
        self._rotation = 0
        self.cold_l2 = self.cold_l3 = self.prewarm_loads = self.l3_fetches = self.evictions = 0
        self._prewarms: list[tuple[int, int, int]] = []  # (minute, node, function)

    def run(self) -> FleetOutcome:
        counts = self.trace.counts
        active = [np.flatnonzero(counts[:, m]) for m in range(self.trace.minutes)]
        for minute, functions in enumerate(active):
            self._prewarm(minute)
            called: list[set[int]] = [set() for _ in self.nodes]
            loads = np.zeros(len(self.nodes), dtype=np.int64)
            for f in functions.tolist():
                calls = int(counts[f, minute])
                for n, share in self._route(f, calls, loads):
                    loads[n] += share
                    self._call(n, f, share, minute)
                    called[n].add(f)
            for n in range(len(self.nodes)):
                self._end_of_minute(n, called[n], minute)
        return FleetOutcome(
            self.config,
            int(counts.sum()),
            self.cold_l2,
            self.cold_l3,
            self.prewarm_loads,
            self.l3_fetches,
            np.array([node.calls for node in self.nodes]),
            np.array([node.memory_mb_min / 1024 for node in self.nodes]),
            np.array([node.peak_mb for node in self.nodes]),
            self.evictions,
        )

    # --- routing -----------------------------------------------------------------------

    def _route(self, f: int, calls: int, loads: np.ndarray) -> list[tuple[int, int]]:
        routing, n = self.config.routing, len(self.nodes)
        if routing is Routing.HASH or n == 1:
            return [(self.homes[f], calls)]
        if routing is Routing.ROUND_ROBIN:
            base, extra = divmod(calls, n)
            start = self._rotation
            self._rotation = (self._rotation + calls) % n
            shares = [(i, base + (1 if (i - start) % n < extra else 0)) for i in range(n)]
            return [(i, s) for i, s in shares if s]
        shift = self._rotation  # ties go to each node in turn
        self._rotation = (self._rotation + 1) % n
        filled = np.roll(water_fill(np.roll(loads, -shift), calls), shift)
        return [(i, int(s)) for i, s in enumerate(filled.tolist()) if s]

    # --- one node ----------------------------------------------------------------------

    def _call(self, n: int, f: int, calls: int, minute: int) -> None:
        node = self.nodes[n]
        resident = node.functions.get(f)
        if resident is None:
            resident = node.functions[f] = _Resident()
        node.calls += calls
        size = self.sizes[f]
        if f in node.loaded:
            node.loaded.move_to_end(f)
        else:
            if node.fetch(f, size):
                self.cold_l3 += 1
                self.l3_fetches += 1
            else:
                self.cold_l2 += 1
            node.trim_disk(self.sizes)
            node.load(f, size)
        if resident.last != minute:
            resident.history.record(minute, calls)
        resident.last, resident.plan, resident.worth = minute, None, None

    def _make_room(self, node: _Node, called: set[int], minute: int) -> None:
        """Evict instances not called this minute until the node is within its memory
        budget, as a node's budget chooses (what was called this minute stays)."""
        budget = self.config.memory_budget_mb
        if node.memory_mb <= budget:
            return
        held = [self._held(node, f, f in called, minute) for f in node.loaded]
        scale = 1024 * 1024  # MB to bytes, as the server's budget counts
        for key in evictions(int(budget * scale), 0, held):
            f = int(key)
            node.unload(f, self.sizes[f])
            resident = node.functions[f]
            resident.plan = resident.worth = None
            self.evictions += 1

    def _held(self, node: _Node, f: int, busy: bool, minute: int) -> Held:
        """``f``'s instance as the node's budget weighs it: under ``auto``, by its plan's
        worth now (other policies: all alike, the least recently called first)."""
        resident = node.functions[f]
        value = 0.0
        if not busy and self.config.policy is Policy.AUTO:
            plan = self._plan(resident, f)
            if resident.worth is None:
                gb = self.sizes[f] / 1024
                resident.worth = worth(self.config.policy_config, resident.history, plan, gb)
            value, _ = weigh(resident.worth, minute - resident.last)
        size = max(1, int(self.sizes[f] * 1024 * 1024))
        return Held(str(f), size, value, float(resident.last), pinned=busy)

    def _end_of_minute(self, n: int, called: set[int], minute: int) -> None:
        """Evict for memory, then keep for the next minute what the plans keep. A run's
        plan is made the first minute with no call after it (the run has ended)."""
        node = self.nodes[n]
        self._make_room(node, called, minute)
        for f in list(node.loaded):
            if f in called:
                continue
            resident = node.functions[f]
            plan = self._plan(resident, f)
            if plan.warm(minute + 1 - resident.last):
                continue
            node.unload(f, self.sizes[f])
            again = resident.last + plan.prewarm_after_min
            if plan.prewarm_after_min and again > minute:  # loaded again before the call
                heapq.heappush(self._prewarms, (again, n, f))
        node.memory_mb_min += node.memory_mb
        node.peak_mb = max(node.peak_mb, node.memory_mb)

    def _plan(self, resident: _Resident, f: int) -> Plan:
        if resident.plan is None:
            resident.plan = decide(
                self.config.policy,
                self.config.policy_config,
                resident.history,
                resident.last,
                self.sizes[f] / 1024,
            )
        return resident.plan

    def _prewarm(self, minute: int) -> None:
        """Load what plans pre-warm for this minute, into free memory only."""
        while self._prewarms and self._prewarms[0][0] <= minute:
            at, n, f = heapq.heappop(self._prewarms)
            node = self.nodes[n]
            if at < minute or node.functions[f].plan is None or f in node.loaded:
                continue  # stale: called since (no plan yet), or already there
            size = self.sizes[f]
            if node.memory_mb + size > self.config.memory_budget_mb:
                continue  # pre-warming never takes memory from a warm function
            if node.fetch(f, size):
                self.l3_fetches += 1
            node.trim_disk(self.sizes)
            node.load(f, size)
            self.prewarm_loads += 1


def simulate_fleet(trace: Trace, config: FleetConfig) -> FleetOutcome:
    return FleetSimulator(trace, config).run()
