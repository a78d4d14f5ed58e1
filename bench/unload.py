"""What the sweep unloading idle thread instances costs the event loop.

    python bench/unload.py [--functions 1000] [--unloads 1,20] [--rounds 3] [--rev REV]

A model loaded in the server's process (``--isolation thread``) is frozen out of
the garbage collector at its load; freeing what it holds in reference cycles at
its unload takes a full collection, which walks every object of the server while
holding the GIL, so the event loop waits for it. The sweep unloads every instance
whose keep-alive ran out in one pass. This builds ``--functions`` real schedulers
(as ``fnrt serve`` builds them, ``bench/budget.py``'s echo handler in a thread,
torch imported as a model's handler would), loads ``--unloads`` of them, then
scales them to zero one after the other as the sweep does, while a task on the
loop ticks every millisecond. Until the unloads' collections are done it reports:

- **full collections** (``gc.callbacks``, generation 2);
- **longest stall**: the most one tick came late (what a request arriving then
  waits);
- **loop stalled**: the lateness of the ticks late by more than ``STALL_MS``,
  together (a tick's usual overshoot of a few tenths of a millisecond, over the
  second the collection may wait, left out);
- **sweep ms**: how long the unloads took on the loop.

Medians of ``--rounds``. ``--rev`` measures fnrt at another git revision (its
packages exported onto ``PYTHONPATH``, the checkout untouched), to set beside it.
Wall-clock: the machine's noise moves the milliseconds; the collections are counts.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: A tick later than this is the loop held up, not a sleep's usual overshoot.
STALL_MS = 2.0


async def sweep(functions: int, unloads: int, work: Path) -> tuple[int, float, float, float]:
    """One round: (full collections, longest stall ms, loop stalled ms, sweep ms)."""
    from budget import served

    from fnrt.runtime import scheduler as sched

    schedulers, _ = await served(work, functions, unloads)
    gc.collect()
    full = [0]

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full[0] += 1

    late: list[float] = []
    ticking = True

    async def tick() -> None:
        while ticking:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            late.append(max(time.perf_counter() - before - 0.001, 0.0))

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0.05)
    late.clear()
    gc.callbacks.append(seen)
    try:
        started = time.perf_counter()
        for scheduler in schedulers[:unloads]:  # as the sweep's pass: one after the other
            await sched.scale_to_zero(scheduler, scheduler.clock.now(), force=True)
        swept = time.perf_counter() - started
        await settled()
    finally:
        gc.callbacks.remove(seen)
        ticking = False
        await ticker
    for scheduler in schedulers:
        await scheduler.pool.close()
    stalled = sum(t for t in late if t * 1e3 > STALL_MS)
    return full[0], max(late) * 1e3, stalled * 1e3, swept * 1e3


async def settled() -> None:
    """Until the collection the unloads asked for has run (none pending: at once)."""
    try:
        from fnrt.runtime.collector import COLLECTOR
    except ImportError:  # a revision before the collector: each unload collected itself
        return
    while COLLECTOR.pending:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # the collection, under way on the timer's thread, ends


def measure(args: argparse.Namespace, work: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import torch  # noqa: F401  (a model's handler imports it: its objects are the heap's)

    for unloads in (int(u) for u in args.unloads.split(",")):
        rows = []
        for r in range(args.rounds):
            folder = work / f"{unloads}-{r}"
            rows.append(asyncio.run(sweep(args.functions, unloads, folder)))
        full, stall, stalled, swept = (statistics.median(col) for col in zip(*rows, strict=True))
        print(
            f"{args.label:>8} {unloads:>7} {full:>16.0f} {stall:>17.1f} {stalled:>16.1f} "
            f"{swept:>9.1f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, default=1000, help="schedulers served")
    parser.add_argument("--unloads", default="1,20", help="instances unloaded in one sweep")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rev", help="also measure fnrt at this git revision, first")
    parser.add_argument("--label", default="", help=argparse.SUPPRESS)  # (a --rev run's)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fnrt-unload-"))
    try:
        if not args.label:
            print(f"{args.functions} functions served, thread isolation, median of {args.rounds}")
            print(
                f"{'fnrt':>8} {'unloads':>7} {'full collections':>16} "
                f"{'longest stall ms':>17} {'loop stalled ms':>16} {'sweep ms':>9}"
            )
            if args.rev:
                run_at(args.rev, args, work)
            args.label = "this"
        measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_at(rev: str, args: argparse.Namespace, work: Path) -> None:
    """This benchmark in a process that imports fnrt at ``rev``."""
    from coldstart_ab import export

    env = os.environ | export(rev, work, "rev")
    argv = [sys.executable, __file__, "--functions", str(args.functions)]
    argv += ["--unloads", args.unloads, "--rounds", str(args.rounds), "--label", rev]
    subprocess.run(argv, env=env, check=True)


if __name__ == "__main__":
    main()
