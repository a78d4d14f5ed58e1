"""What a node's checks over its functions cost the event loop as it serves more of them.

    python bench/budget.py [--functions 100,10000] [--loaded 20] [--rounds 20]

A node keeps a scheduler for every function version it has served, cold or
not. Before each load the memory budget makes room (``MemoryBudget.make_room``);
the sweep, each second, asks whether the budget has room (``fits``) for each
instance a filling plan keeps, and passes by each function at rest. This
builds ``--functions`` real schedulers (as ``fnrt serve`` builds them, a small
echo handler in a thread), loads ``--loaded`` of them, and times the three two
ways in the same run:

- over every scheduler, as the node did (``node.schedulers()``; a sweep that
  looks at each function);
- over those holding an instance, as it does (``Holders``, kept by the pools;
  a sweep that looks at those, the ones kept for a rollback and those with a
  plan pending). The sweep's table is the real ``Sweeper`` over a table of the
  schedulers (no store), with no keeper.

It prints the median milliseconds of each, and every scheduler over the holders.
Wall-clock on the calling thread; the machine's noise moves them, not their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Executor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fnrt.functions.manifest import IsolationMode  # noqa: E402
from fnrt.functions.version import VersionManifest  # noqa: E402
from fnrt.loader.device import detect_device  # noqa: E402
from fnrt.loader.instance import Instance, InstanceLoader  # noqa: E402
from fnrt.loader.memory import Holders, MemoryBudget, Resident  # noqa: E402
from fnrt.loader.repository import Repository  # noqa: E402
from fnrt.loader.stores import FileStore  # noqa: E402
from fnrt.runtime import scheduler as sched  # noqa: E402
from fnrt.runtime.clock import ManualClock  # noqa: E402
from fnrt.runtime.events import NoEvents  # noqa: E402
from fnrt.runtime.intake import Admission  # noqa: E402
from fnrt.runtime.scheduler import Scheduler, SchedulerFactory  # noqa: E402
from fnrt.runtime.sweeper import Sweeper  # noqa: E402
from support import publish, write_function  # noqa: E402


def echo(vm: VersionManifest, executor: Executor) -> Instance:
    """An instance of a handler that returns its inputs (256 MiB, as the budget sees it)."""
    timings = {"fetch_s": 0.0, "verify_s": 0.0, "import_s": 0.0, "load_s": 0.0, "total_s": 0.0}
    return Instance(vm, lambda batch: batch, executor, None, timings, 256 << 20)


class Table:
    """The registry as the sweep reads it: every function served, one version each."""

    def __init__(self, schedulers: list[Scheduler]) -> None:
        self._entries = [
            SimpleNamespace(name=s.name, left_at={}, schedulers={"v": s}, primary=s)
            for s in schedulers
        ]

    def entries(self) -> list[Any]:
        return list(self._entries)

    rollbacks = SimpleNamespace(names=set)


def sweeper(schedulers: list[Scheduler], holders: Holders | None) -> Sweeper:
    table, splits = cast(Any, Table(schedulers)), cast(Any, SimpleNamespace(active=False))
    budget = MemoryBudget(None, lambda: ())
    holding = None if holders is None else (lambda: cast(list[Scheduler], holders()))
    return Sweeper(table, splits, cast(Any, None), budget, ManualClock(), holding=holding)


async def served(work: Path, functions: int, loaded: int) -> tuple[list[Scheduler], Holders]:
    """``functions`` schedulers of copies of one echo version, the first ``loaded`` warm."""
    repository = Repository(FileStore(work / "store"))
    loader = InstanceLoader(repository, work / "cache", detect_device("cpu"))
    holders = Holders()
    factory = SchedulerFactory(
        loader, ManualClock(), NoEvents(), Admission(100), isolation=IsolationMode.THREAD
    )
    factory = dataclasses.replace(factory, holders=holders)
    vm = publish(repository, write_function(work / "src", "echo"))
    schedulers = []
    for i in range(functions):
        copy = dataclasses.replace(vm, manifest=dataclasses.replace(vm.manifest, name=f"f{i}"))
        schedulers.append(factory(copy, echo))
    for scheduler in schedulers[:loaded]:
        await scheduler.pool.ensure(scheduler.pool.slots[0])
    return schedulers, holders


async def timed_ms(check: Callable[[], Awaitable[Any] | Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        result = check()
        if asyncio.iscoroutine(result):
            await result
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


async def measure(functions: int, loaded: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        schedulers, holders = await served(Path(folder), functions, loaded)
        ways: dict[str, Callable[[], Iterable[Resident]]] = {
            "every": lambda: schedulers,
            "holders": holders,
        }
        out = {}
        for way, residents in ways.items():
            budget = MemoryBudget(64 << 30, residents)  # room for all: nothing is evicted
            out[f"fits {way}"] = await timed_ms(lambda b=budget: b.fits(0), rounds)
            out[f"room {way}"] = await timed_ms(
                lambda b=budget: b.make_room("new/1", 256 << 20), rounds
            )
            sweeps = sweeper(schedulers, holders if way == "holders" else None)
            out[f"sweep {way}"] = await timed_ms(sweeps.sweep, rounds)
        for scheduler in schedulers:
            await sched.close(scheduler)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", default="100,10000")
    parser.add_argument("--loaded", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    counts = [int(n) for n in args.functions.split(",")]
    print(f"\nms a check, median of {args.rounds}, {args.loaded} of them loaded\n")
    print(f"{'functions':>9} {'check':>6} {'every':>9} {'holders':>9} {'every/holders':>14}")
    for functions in counts:
        found = asyncio.run(measure(functions, args.loaded, args.rounds))
        for check in ("fits", "room", "sweep"):
            every, held = found[f"{check} every"], found[f"{check} holders"]
            print(f"{functions:>9} {check:>6} {every:>9.3f} {held:>9.3f} {every / held:>13.1f}x")


if __name__ == "__main__":
    main()
