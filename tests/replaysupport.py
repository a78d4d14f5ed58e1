"""A trace slice replayed through a live node under a small memory budget, against the
simulator: shared by tests/runtime/prewarm/test_live_order.py and
``bench/prewarm.py --checks 5``.

The node is the server ``fnrt serve`` runs (its app and node, built from its
settings) on a real uvicorn socket on 127.0.0.1, with a manual clock a minute
of the trace moves at once (a day's slice replays in seconds). Each call is an
HTTP request; after each minute the sweeper runs, as its timer would, and the
pre-warms it starts finish before the next minute's calls (as their lead, the load's
time, makes them on a node in real time). The
budget is set to three instances' bytes once three are loaded, so from there on
the budget decides. The live order of evictions is read from the node's logs
(``fnrt.memory``: "evicting ... (reason: budget)"), then the same trace, with
the instances' measured sizes, runs through
:func:`~fnrt.runtime.prewarm.node.simulate_node`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fnrt.runtime.clock import ManualClock
from fnrt.runtime.node import Node
from fnrt.runtime.prewarm.keeper import Keeper
from fnrt.runtime.prewarm.node import GB, simulate_node
from fnrt.runtime.prewarm.trace import Trace
from support import ECHO_MANIFEST, live_server, make_node, write_function

X = [[1.0, 2.0, 3.0, 4.0]]
BASE_UNIX = 1_800_000_000.0  # a minute boundary
MINUTES = 150
_EVICTING = re.compile(r"evicting (\S+) to make room for \S+ \(reason: (\w+)\)")


def trace_slice(minutes: int = MINUTES) -> Trace:
    """Five functions, each on its own rhythm, never two starting in one minute (a call
    in the live node is over at once; the simulator holds a busy minute's instance)."""
    counts = np.zeros((5, minutes), dtype=np.int32)
    rhythm = {0: (4, 0), 1: (7, 1), 2: (11, 2), 3: (17, 3), 4: (30, 5)}  # period, offset
    taken: set[int] = set()
    for f, (period, offset) in rhythm.items():
        for m in range(offset, minutes, period):
            while m in taken:
                m += 1
            if m < minutes:
                counts[f, m] = 1
                taken.add(m)
    names = [f"f{f}" for f in range(5)]
    return Trace(names, names, ["http"] * 5, counts)


@dataclass(frozen=True)
class Replayed:
    """The budget evictions of a live node and of the simulator, (minute, function) each."""

    budget_bytes: int | None
    sizes: list[int]  # each instance's bytes, as loaded
    live: list[tuple[int, str]]
    simulated: list[tuple[int, str]]

    @property
    def matches(self) -> bool:
        return bool(self.live) and self.live == self.simulated


class _Evictions(logging.Handler):
    """The node's eviction log lines, at the manual clock's minute."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(logging.INFO)
        self.clock = clock
        self.seen: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = _EVICTING.search(record.getMessage())
        if found and found.group(2) == "budget":
            self.seen.append((int(self.clock.now() // 60), found.group(1).split("/")[0]))


async def _settled(node: Node) -> None:
    """Until the node's background work (pre-warms) is done."""
    await asyncio.gather(*node.registry._tasks, return_exceptions=True)


def replay(tmp: Path, trace: Trace) -> Replayed:
    """Replay ``trace`` (at most a few functions, one call a minute) through a live node in
    ``tmp`` under a budget of three of its instances, and the simulator under the same."""
    clock = ManualClock(start=0.0)
    # as under ``fnrt serve --memory-budget-bytes``: each plan fills the budget or not
    keeper = Keeper(tmp / "history.json", wall=lambda: BASE_UNIX + clock.now(), fill_memory=None)
    node = make_node(tmp, clock, keeper=keeper)
    logs = _Evictions(clock)
    memory_log = logging.getLogger("fnrt.memory")
    level = memory_log.level
    memory_log.addHandler(logs)
    memory_log.setLevel(logging.INFO)
    try:
        with live_server(tmp, node=node) as srv, srv.client() as c:
            for name in trace.functions:
                folder = write_function(tmp, name, manifest=ECHO_MANIFEST)
                srv.deploy(folder)
            schedulers = [srv.call(node.registry.get(n)) for n in trace.functions]
            sized = False
            sizes = [0] * len(schedulers)
            for minute in range(trace.minutes):
                for f in np.flatnonzero(trace.counts[:, minute]).tolist():
                    r = c.post(f"/v1/functions/{trace.functions[f]}/invoke", json={"x": X})
                    if r.status_code != 200:
                        raise RuntimeError(f"minute {minute}: {r.status_code} {r.text}")
                    sizes[f] = max(sizes[f], schedulers[f].resident_bytes)
                    if not sized and all(s.resident_bytes for s in schedulers[:3]):
                        # three instances fit: from here on, the budget decides
                        node.memory.budget_bytes = sum(s.resident_bytes for s in schedulers[:3])
                        sized = True
                clock.advance(60)
                srv.call(node.sweeper.sweep())
                # a pre-warm starts its load's time ahead of the minute it is for (the
                # simulator's are loaded at once): the minute's calls find them loaded
                srv.call(_settled(node))
            budget = node.memory.budget_bytes
    finally:
        memory_log.removeHandler(logs)
        memory_log.setLevel(level)
    simulated: list[tuple[int, str]] = []
    if budget is not None and all(sizes):
        trace.memory_mb = np.array([b / 2**20 for b in sizes], dtype=float)
        simulated = simulate_node(trace, "auto", budget / GB, record=True).order
    return Replayed(budget, sizes, logs.seen, simulated)
