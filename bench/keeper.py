"""What the pre-warm keeper costs the event loop, as the number of functions grows.

    python bench/keeper.py [--functions 10000] [--called 200] [--rounds 5]

A node keeps a :class:`~fnrt.runtime.prewarm.history.History` per function it has
served (up to 10,000) and saves them once a minute: the event loop takes a
snapshot (``Keeper.snapshot``), a thread writes it (``Keeper.write``). This
fills a keeper with ``--functions`` histories of five hours of sparse calls,
then times, in the same run:

- a save after every function was called in the minute (what every save cost
  before a snapshot copied only the histories changed since the last one);
- a save after ``--called`` of them were (the usual minute of a large node).

It prints the median milliseconds of each part, and the second over the first.
Then what a call costs the request path when it commits a function's last
minute to its history: a known function's against a new one's at the cap,
whose history takes the place of the least recently called one. Then a node's
start: the keeper reading the saved histories, against ``json.loads`` of the
same file (the least reading it can take). Last, the
sweep's part (each second it asks the plan of every function with one
pending): a plan made after a call, under a memory budget, and a plan asked
again with nothing new, microseconds each at ``--functions`` against the same
at 100 functions (1x: a function's plan costs the same however many there are).
Wall-clock on the thread that calls them; the machine's noise moves them, not
their ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from fnrt.runtime.prewarm.keeper import Keeper
from fnrt.runtime.prewarm.policies import Policy


def filled(path: Path, functions: int, wall: list[float]) -> Keeper:
    """A keeper with ``functions`` histories: five hours, each called in 5% of the minutes."""
    keeper = Keeper(path, wall=lambda: wall[0])
    rng = random.Random(1)
    names = [f"f{i}" for i in range(functions)]
    for _ in range(300):
        for name in names:
            if rng.random() < 0.05:
                keeper.invoked(name)
        wall[0] += 60
    for name in names:
        keeper.invoked(name)
    settle(keeper, names, wall)
    keeper.write(keeper.snapshot())
    return keeper


def settle(keeper: Keeper, names: list[str], wall: list[float]) -> None:
    """The minute over and every called function's calls in its history, as the sweep
    does for each function (``Keeper.act`` settles a minute that is over)."""
    wall[0] += 60
    for name in names:
        keeper._settle(name)


def timed_save(keeper: Keeper, names: list[str], wall: list[float]) -> tuple[float, float]:
    """``names`` called in a minute, then one save: its snapshot's and write's ms."""
    for name in names:
        keeper.invoked(name)
    settle(keeper, names, wall)
    started = time.perf_counter()
    snapshot = keeper.snapshot()
    taken = time.perf_counter()
    keeper.write(snapshot)
    return (taken - started) * 1e3, (time.perf_counter() - taken) * 1e3


def commit_us(keeper: Keeper, names: list[str], wall: list[float]) -> float:
    """Microseconds a call takes that commits the minute before of each of ``names``
    (called in it) to its history."""
    for name in names:
        keeper.invoked(name)
    wall[0] += 60
    started = time.perf_counter()
    for name in names:
        keeper.invoked(name)
    return (time.perf_counter() - started) / len(names) * 1e6


def plan_us(functions: int, wall: list[float]) -> tuple[float, float]:
    """Microseconds a plan takes, made (under a budget) and asked again, among
    ``functions`` functions, each called six times half an hour apart."""
    keeper = Keeper(None, wall=lambda: wall[0], fill_memory=None)
    names = [f"f{i}" for i in range(functions)]
    for _ in range(6):
        for name in names:
            keeper.invoked(name)
        wall[0] += 30 * 60
    sample = names[:: max(functions // 100, 1)]
    for name in names:
        if name not in sample:
            keeper.plan(name, Policy.AUTO, memory_gb=0.5, budget_bytes=2**34)
    started = time.perf_counter()
    for name in sample:
        keeper.plan(name, Policy.AUTO, memory_gb=0.5, budget_bytes=2**34)
    made = (time.perf_counter() - started) / len(sample) * 1e6
    started = time.perf_counter()
    for name in names:
        keeper.plan(name, Policy.AUTO, memory_gb=0.5, budget_bytes=2**34)
    return made, (time.perf_counter() - started) / len(names) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, default=10_000)
    parser.add_argument("--called", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        wall = [1_800_000_000.0]
        keeper = filled(Path(folder) / "history.json", args.functions, wall)
        names = sorted(keeper.histories)
        every: list[tuple[float, float]] = []
        some: list[tuple[float, float]] = []
        for _ in range(args.rounds):  # interleaved
            every.append(timed_save(keeper, names, wall))
            some.append(timed_save(keeper, names[: args.called], wall))
        path = Path(folder) / "history.json"
        size_mb = path.stat().st_size / 1e6
        loads = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            Keeper(path)
            read = time.perf_counter()
            json.loads(path.read_bytes())
            loads.append(((read - started) * 1e3, (time.perf_counter() - read) * 1e3))
    print(f"\n{args.functions} histories ({size_mb:.1f} MB saved), median of {args.rounds}\n")
    print(f"{'called in the minute':<22} {'snapshot ms':>12} {'write ms':>10}")
    rows = ((f"all {args.functions}", every), (str(args.called), some))
    for label, times in rows:
        snap = statistics.median(t[0] for t in times)
        write = statistics.median(t[1] for t in times)
        print(f"{label:<22} {snap:>12.1f} {write:>10.1f}")
    ratio_snap = statistics.median(t[0] for t in some) / statistics.median(t[0] for t in every)
    ratio_write = statistics.median(t[1] for t in some) / statistics.median(t[1] for t in every)
    ratios = f"snapshot {ratio_snap:.3f}x, write {ratio_write:.3f}x"
    print(f"\n{args.called} called / all {args.functions} called: {ratios}")
    start_ms = statistics.median(t[0] for t in loads)
    parse_ms = statistics.median(t[1] for t in loads)
    print(
        f"\na node's start, the histories read: {start_ms:.0f} ms, json.loads of the file "
        f"{parse_ms:.0f} ms ({start_ms / parse_ms:.1f}x)"
    )
    known = commit_us(keeper, names[: args.called], wall)
    new = commit_us(keeper, [f"new{i}" for i in range(args.called)], wall)
    print(
        f"\na call committing its function's minute: known {known:.1f} us, new at the cap "
        f"{new:.1f} us ({new / known:.2f}x)"
    )
    small = plan_us(100, [1_800_000_000.0])
    large = plan_us(args.functions, [1_800_000_000.0])
    print(f"\n{'a plan':<22} {'100 us':>8} {f'{args.functions} us':>10} {'ratio':>7}")
    for label, a, b in (("made (budget)", small[0], large[0]), ("asked again", small[1], large[1])):
        print(f"{label:<22} {a:>8.1f} {b:>10.1f} {b / a:>6.2f}x")


if __name__ == "__main__":
    main()
