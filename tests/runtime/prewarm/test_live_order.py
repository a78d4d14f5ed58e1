"""A live node under a small memory budget evicts what ``fnrt simulate`` evicts, in order."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fnrt.runtime.clock import ManualClock
from fnrt.runtime.prewarm.keeper import Keeper
from fnrt.runtime.prewarm.node import GB, simulate_node
from fnrt.runtime.prewarm.trace import Trace
from support import ECHO_MANIFEST, live_server, make_node, publish, write_function

X = [[1.0, 2.0, 3.0, 4.0]]
BASE_UNIX = 1_800_000_000.0  # a minute boundary
MINUTES = 150


def trace_slice() -> Trace:
    """Five functions, each on its own rhythm, never two starting in one minute (a call
    in the live node is over at once; the simulator holds a busy minute's instance)."""
    counts = np.zeros((5, MINUTES), dtype=np.int32)
    rhythm = {0: (4, 0), 1: (7, 1), 2: (11, 2), 3: (17, 3), 4: (30, 5)}  # period, offset
    taken: set[int] = set()
    for f, (period, offset) in rhythm.items():
        for m in range(offset, MINUTES, period):
            while m in taken:
                m += 1
            if m < MINUTES:
                counts[f, m] = 1
                taken.add(m)
    names = [f"f{f}" for f in range(5)]
    return Trace(names, names, ["http"] * 5, counts)


def test_a_live_node_evicts_what_the_simulator_evicts_in_the_same_order(
    tmp_path: Path,
) -> None:
    trace = trace_slice()
    clock = ManualClock(start=0.0)
    keeper = Keeper(tmp_path / "history.json", wall=lambda: BASE_UNIX + clock.now())
    node = make_node(tmp_path, clock, keeper=keeper)
    live: list[tuple[int, str]] = []
    counted = node.memory.evicted

    def evicted(key: str, why: str) -> None:
        if why == "budget":
            live.append((int(clock.now() // 60), key.split("/")[0]))
        if counted is not None:
            counted(key, why)

    node.memory.evicted = evicted
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        for name in trace.functions:
            folder = write_function(tmp_path, name, manifest=ECHO_MANIFEST)
            srv.call(node.deployer.deploy(publish(node.repository, folder)))
        schedulers = [srv.call(node.registry.get(n)) for n in trace.functions]
        sized = False
        sizes = [0] * len(schedulers)  # each instance's bytes, as loaded
        for minute in range(MINUTES):
            for f in np.flatnonzero(trace.counts[:, minute]).tolist():
                r = c.post(f"/v1/functions/{trace.functions[f]}/invoke", json={"x": X})
                assert r.status_code == 200
                sizes[f] = max(sizes[f], schedulers[f].resident_bytes)
                if not sized and all(s.resident_bytes for s in schedulers[:3]):
                    # three instances fit: from here on, the budget decides
                    node.memory.budget_bytes = sum(s.resident_bytes for s in schedulers[:3])
                    sized = True
            clock.advance(60)
            srv.call(node.sweeper.sweep())
        budget = node.memory.budget_bytes
    assert sized and budget is not None and live, "the budget never had to choose"
    assert all(sizes)
    trace.memory_mb = np.array([b / 2**20 for b in sizes], dtype=float)
    simulated = simulate_node(trace, "auto", budget / GB, record=True)
    assert live == simulated.order
