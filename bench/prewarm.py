"""Keep-alive at a price: is ``auto`` on the Pareto frontier, on functions it was not tuned on?

    python bench/prewarm.py [--splits 5] [--synthetic 1000] [--days 3] [--plot prewarm.png]

Every figure is a ratio against a fixed 10-minute keep-alive replayed over the
same functions in the same run (minute granularity, one instance per
function, idle memory in GB·min weighted by each app's memory: the accounting
of ``fnrt simulate``). Three checks:

1. **Held-out halves.** The Azure 2019 sample's 330 functions are split at
   random into two halves, ``--splits`` times; on each half, ``auto`` at the
   default price (5,000 GB·s) must have at most 0.5x the cold starts of fixed
   10 minutes at no more idle memory. Its constants (price, prior weight) were
   chosen on the whole day, so each half is a day of functions seen only as
   part of it; this is how far that choice holds.
2. **The frontier, on the sample.** ``auto`` at prices from 300 to 80,000 GB·s
   against every fixed keep-alive from 1 to 240 minutes and the other
   policies: none may have both fewer cold starts and less idle memory.
3. **The frontier, over several days.** The same on a synthetic trace of
   ``--days`` days (periodic timers, bursty HTTP over a daily cycle, rare
   functions, daily jobs: what time-of-day and the forecast need days for).

It exits 1 when a check fails. ``--plot`` draws the sample's curves.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from fnrt.runtime.prewarm.policies import Policy, PolicyConfig
from fnrt.runtime.prewarm.report import plot
from fnrt.runtime.prewarm.simulator import Outcome, simulate
from fnrt.runtime.prewarm.trace import Trace, read_app_memory, read_invocations, subset, synthetic

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "azure2019-sample"
PRICES_GB_S = (300.0, 1250.0, 5000.0, 20000.0, 80000.0)


def sample() -> Trace:
    trace = read_invocations([SAMPLE / "invocations_per_function.csv"])
    read_app_memory(SAMPLE / "app_memory.csv", trace)
    return trace


def ratios(outcome: Outcome, base: Outcome) -> tuple[float, float]:
    """Cold starts and idle GB·min of ``outcome`` over ``base``'s."""
    assert outcome.idle_gb_minutes is not None and base.idle_gb_minutes is not None
    return (
        outcome.cold_starts / base.cold_starts,
        outcome.idle_gb_minutes / base.idle_gb_minutes,
    )


def halves(trace: Trace, splits: int, workers: int) -> bool:
    print(f"1. auto at the default price on held-out halves of the sample ({splits} splits)")
    print(
        f"   {'split':>5}  {'half':>4}  {'functions':>9}  {'cold starts':>11}  {'idle GB·min':>11}"
    )
    ok = True
    worst = [0.0, 0.0]
    for split in range(splits):
        rows = np.random.default_rng(split).permutation(trace.counts.shape[0])
        for h, half in enumerate(np.array_split(rows, 2)):
            fixed, auto = simulate(
                subset(trace, half.tolist()),
                [Policy.FIXED, Policy.AUTO],
                fixed_keep_alive_min=(10,),
                workers=workers,
            )
            cold, memory = ratios(auto, fixed)
            worst = [max(worst[0], cold), max(worst[1], memory)]
            good = cold <= 0.5 and memory <= 1.0
            ok &= good
            print(
                f"   {split:>5}  {h:>4}  {len(half):>9}  {cold:>10.2f}x  {memory:>10.2f}x"
                f"{'' if good else '  FAIL'}"
            )
    print(f"   worst: {worst[0]:.2f}x the cold starts, {worst[1]:.2f}x the idle memory")
    print("   goal:  <= 0.50x, <= 1.00x")
    return ok


def frontier(title: str, trace: Trace, workers: int, png: str | None) -> bool:
    print(f"\n{title}")
    outcomes = simulate(
        trace,
        list(Policy),
        fixed_keep_alive_min=range(1, 241),
        prices_gb_s=PRICES_GB_S,
        workers=workers,
    )
    base = next(o for o in outcomes if o.label == "fixed 10 min")
    autos = [o for o in outcomes if o.label.startswith("auto")]
    others = [o for o in outcomes if not o.label.startswith("auto")]
    ok = True
    print(f"   {'policy':<20} {'cold starts':>11}  {'idle GB·min':>11}  beaten on both axes by")
    for o in autos + [x for x in others if not x.label.startswith("fixed")]:
        cold, memory = ratios(o, base)
        beaten = [
            x.label for x in others if x.cold_starts < o.cold_starts and ratios(x, base)[1] < memory
        ]
        if o in autos:
            ok &= not beaten
            shown = ", ".join(beaten[:3]) + (" ..." if len(beaten) > 3 else "") or "none"
        else:
            shown = ""
        print(f"   {o.label:<20} {cold:>10.2f}x  {memory:>10.2f}x  {shown}")
    for minutes in (5, 20, 60, 240):
        o = next(x for x in others if x.label == f"fixed {minutes} min")
        cold, memory = ratios(o, base)
        print(f"   {o.label:<20} {cold:>10.2f}x  {memory:>10.2f}x")
    if png:
        shown = [o for o in outcomes if not o.label.startswith("fixed")]
        shown += [
            o
            for o in others
            if o.label in {f"fixed {m} min" for m in (1, 2, 5, 10, 20, 60, 120, 240)}
        ]
        print(f"   plot: {plot(shown, Path(png), title)}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, default=5, help="random halvings of the sample")
    parser.add_argument(
        "--synthetic", type=int, default=1000, help="functions of the synthetic trace"
    )
    parser.add_argument("--days", type=int, default=3, help="days of the synthetic trace")
    parser.add_argument("--seed", type=int, default=1, help="seed of the synthetic trace")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--plot", metavar="PNG", help="draw the sample's frontier here")
    args = parser.parse_args()
    started = time.perf_counter()
    price = PolicyConfig().cold_start_price_gb_s
    print(f"auto's default price of a cold start: {price:,.0f} GB·s; ratios against fixed 10 min\n")
    trace = sample()
    ok = halves(trace, args.splits, args.workers)
    ok &= frontier(
        "2. the frontier on the Azure sample (1 day, 330 functions)", trace, args.workers, args.plot
    )
    made = synthetic(args.synthetic, days=args.days, seed=args.seed)
    title = f"3. the frontier on a synthetic trace ({args.days} days, {args.synthetic:,} functions)"
    ok &= frontier(title, made, args.workers, None)
    print(
        f"\n{'all checks hold' if ok else 'A CHECK FAILED'} ({time.perf_counter() - started:.0f} s)"
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
