"""Keep-alive at a price: does ``auto``'s default carry over, and is it on the Pareto frontier?

    python bench/prewarm.py [--checks 1,2,3] [--synthetic 300] [--days 2] [--plot prewarm.png]

Every figure is a ratio against a fixed 10-minute keep-alive replayed over the
same functions in the same run (minute granularity, one instance per
function, idle memory in GB·min weighted by each function's memory: the
accounting of ``fnrt simulate``). Three checks:

1. **A default that carries over.** The days are split in two halves: each
   half of the Azure 2019 sample's functions (split at random, seed 0) and a
   synthetic day (``--synthetic`` functions over ``--days`` days) of each shape
   in ``VARIED_SHAPES`` (small and large functions, sparse and busy, smooth and
   bursty; other seeds in each half). Each half chooses ``auto``'s price, in
   seconds of the mean instance, as the one of ``GRID_MEAN_S`` whose worst day
   is furthest inside the goal (at most 0.5x the cold starts of fixed 10 minutes
   at no more than 1.0x its idle memory); the other half checks it, and the
   default (``PolicyConfig().cold_start_price_mean_s``), on every one of its days.
2. **The frontier, on the sample.** ``auto`` at prices from 1,000 to 16,000 s
   against every fixed keep-alive from 1 to 240 minutes and the other
   policies: none may have both fewer cold starts and less idle memory.
3. **The frontier, over several days.** The same on a synthetic trace of
   3 days (periodic timers, bursty HTTP over a daily cycle, rare functions,
   daily jobs: what time-of-day and the forecast need days for).

4. **The node's memory as a cache.** Both halves of the sample and half A's
   synthetic days (one of each shape) on one node whose memory holds 25%, 50%
   and 100% of a fixed 10-minute keep-alive's peak: ``auto`` at its default
   (each plan fills the budget while the working set, what fixed 10 minutes
   would hold, fits it: :func:`fnrt.runtime.prewarm.policies.fills`) against
   FaasCache's Greedy-Dual and LRU; the goal is at most 0.8x Greedy-Dual's cold
   starts and 0.6x LRU's, for the default alone (``--modes`` prints ``auto``
   never filling and always filling beside it, judged on nothing). Beside them
   the floor (:func:`fnrt.runtime.prewarm.bound.floor`: first calls, and runs
   that cannot fit beside the instances busy in their minute, or on what stays
   loaded over the budget after it, even pre-warmed by an oracle); a cell whose
   floor is above the goal's cold starts is out of reach for any policy (proven),
   the others that fail are unreached. ``--oracle`` adds Belady's evictions (they
   know every call ahead, never pre-warm: a heuristic with instances of
   different sizes, not a bound) and a clairvoyant planner (each function
   pre-warmed in the minute of its next call, into free memory, Belady's
   evictions: what knowing the calls ahead gives on this node's rules).
   ``--plot`` draws half A of the sample's cold starts by budget beside the
   frontier (``-node`` added to its name). ``--day``
   and ``--budgets`` pick cells (``--day "half B" --budgets 25``), ``--half B``
   takes half B's synthetic days (seeds 200+) in place of half A's, and
   ``--causes`` breaks each cell's cold starts down by cause (first call,
   evicted by the budget after a call or after a pre-warm, unloaded by the plan
   and pre-warmed too late or into no room, window ran out), each with how many
   of them the floor's oracle avoids.

5. **A live node evicts what the simulator evicts.** A slice of five functions
   (150 minutes) replayed through the server ``fnrt serve`` runs (its app and
   node on a real uvicorn socket on 127.0.0.1, a manual clock a minute of the
   trace moves at once) under a memory budget of three of its instances: the
   budget evictions read from the node's log, beside the simulator's for the same
   trace and sizes, in order (``tests/replaysupport.py``, which
   ``tests/runtime/prewarm/test_live_order.py`` runs too).

It exits 1 when a check fails. ``--plot`` draws the sample's curves.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from fnrt.runtime.prewarm.bound import Floor, floor, strict_cold
from fnrt.runtime.prewarm.node import (
    CLAIRVOYANT,
    ORACLE,
    Cause,
    NodeOutcome,
    fixed_peak_gb,
    simulate_node,
)
from fnrt.runtime.prewarm.policies import Policy, PolicyConfig
from fnrt.runtime.prewarm.report import node_plot, plot
from fnrt.runtime.prewarm.simulator import Outcome, simulate
from fnrt.runtime.prewarm.trace import (
    VARIED_SHAPES,
    Trace,
    read_app_memory,
    read_invocations,
    subset,
    synthetic,
)

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "azure2019-sample"
PRICES_MEAN_S = (1000.0, 2000.0, 4000.0, 8000.0, 16000.0)


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


#: The prices a half of the days chooses the default from, in seconds of the mean instance.
GRID_MEAN_S = (1000.0, 1400.0, 2000.0, 2800.0, 4000.0, 5600.0, 8000.0, 11000.0, 16000.0)
GOAL_COLD, GOAL_MEMORY = 0.5, 1.0  # against fixed 10 minutes


def days(
    synthetic_functions: int, synthetic_days: int
) -> tuple[dict[str, Trace], dict[str, Trace]]:
    """Two halves of the days the default is judged on: each half of the Azure sample (its
    functions split at random, seed 0) and a synthetic day of every shape in
    ``VARIED_SHAPES`` (seeds 100+ in one half, 200+ in the other)."""
    trace = sample()
    rows = np.random.default_rng(0).permutation(trace.counts.shape[0])
    halves: tuple[dict[str, Trace], dict[str, Trace]] = ({}, {})
    for h, part in enumerate(np.array_split(rows, 2)):
        halves[h][f"Azure sample, half {'AB'[h]}"] = subset(trace, part.tolist())
        for i, shape in enumerate(VARIED_SHAPES):
            made = synthetic(
                synthetic_functions, synthetic_days, seed=100 * (h + 1) + i, shape=shape
            )
            halves[h][shape.label] = made
    return halves


def slack(cold: float, memory: float) -> float:
    """How far inside the goal a pair of ratios is (> 1: met, with room)."""
    return min(GOAL_COLD / max(cold, 1e-9), GOAL_MEMORY / max(memory, 1e-9))


def measure(half: dict[str, Trace], workers: int) -> dict[str, dict[float, tuple[float, float]]]:
    """Per day, per price: auto's cold starts and idle memory over fixed 10 minutes'."""
    out: dict[str, dict[float, tuple[float, float]]] = {}
    for name, trace in half.items():
        fixed, *autos = simulate(
            trace,
            [Policy.FIXED, Policy.AUTO],
            fixed_keep_alive_min=(10,),
            prices_mean_s=GRID_MEAN_S,
            workers=workers,
        )
        out[name] = {p: ratios(a, fixed) for p, a in zip(GRID_MEAN_S, autos, strict=True)}
    return out


def choose(measured: dict[str, dict[float, tuple[float, float]]]) -> float:
    """The price whose worst day is furthest inside the goal."""
    return max(GRID_MEAN_S, key=lambda p: min(slack(*by[p]) for by in measured.values()))


def carries_over(synthetic_functions: int, synthetic_days: int, workers: int) -> bool:
    default = PolicyConfig().cold_start_price_mean_s
    print(
        "1. the default price, chosen on half of the days and checked on the other half\n"
        f"   (prices {', '.join(f'{p:g}' for p in GRID_MEAN_S)} s of the mean instance; goal "
        f"<= {GOAL_COLD}x the cold starts of fixed 10 min at <= {GOAL_MEMORY}x its idle memory)"
    )
    halves = days(synthetic_functions, synthetic_days)
    measured = [measure(half, workers) for half in halves]
    ok = True
    for h in (0, 1):
        chosen = choose(measured[h])
        print(f"\n   half {'AB'[h]} chooses {chosen:,.0f} s; half {'BA'[h]} checks it:")
        print(f"   {'day':<52} {'cold':>6} {'memory':>7}   at the default {default:,.0f} s")
        for name, by in measured[1 - h].items():
            cold, memory = by[chosen]
            dcold, dmemory = by[default] if default in by else (float("nan"), float("nan"))
            good = slack(cold, memory) >= 1 and slack(dcold, dmemory) >= 1
            ok &= good
            print(
                f"   {name:<52} {cold:>5.2f}x {memory:>6.2f}x   {dcold:>5.2f}x {dmemory:>6.2f}x"
                f"{'' if good else '  FAIL'}"
            )
    return ok


def frontier(title: str, trace: Trace, workers: int, png: str | None) -> bool:
    print(f"\n{title}")
    outcomes = simulate(
        trace,
        list(Policy),
        fixed_keep_alive_min=range(1, 241),
        prices_mean_s=PRICES_MEAN_S,
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


SHARES = (0.25, 0.5, 1.0)  # node budgets, of fixed 10 minutes' peak memory
GOAL_GD, GOAL_LRU = 0.8, 0.6


def causes(trace: Trace, outcomes: list[NodeOutcome], budget_gb: float) -> None:
    """Each policy's cold starts by cause (:class:`~fnrt.runtime.prewarm.node.Cause`), each
    split into those the oracle of the floor has too (cold by its strict count: first
    calls, runs that do not fit beside the busy ones) and those it avoids (pre-warmed in
    their minute)."""
    unavoidable = strict_cold(trace, budget_gb)
    index = {name: f for f, name in enumerate(trace.functions)}
    for o in outcomes:
        both = dict.fromkeys(Cause, 0)
        avoided = dict.fromkeys(Cause, 0)
        for minute, name, why in o.colds:
            (both if (minute, index[name]) in unavoidable else avoided)[why] += 1
        print(
            f"      {o.policy}: {o.cold_starts:,} cold ({sum(avoided.values()):,} that the "
            f"oracle avoids); evictions {o.evictions}; pre-warms {o.prewarms:,}, "
            f"{o.prewarms_skipped:,} found no room"
        )
        for why in Cause:
            if both[why] or avoided[why]:
                total = both[why] + avoided[why]
                print(f"         {why.value:<30} {total:>7,}  oracle avoids {avoided[why]:>7,}")


def node_memory(
    synthetic_functions: int,
    synthetic_days: int,
    oracle: bool,
    modes: bool,
    png: str | None,
    day: str = "",
    shares: tuple[float, ...] = (),
    why: bool = False,
    half: str = "A",
) -> bool:
    """4. Each half of the sample and a synthetic day of each shape (seeds 100+) on one node
    whose memory holds 25%, 50% and 100% of fixed 10 minutes' peak: ``auto`` at its
    default against Greedy-Dual and LRU, beside the floor no policy goes below (and, with
    ``oracle``, Belady's evictions, which know every call ahead; with ``modes``, ``auto``
    never and always filling the budget). ``day``: only the days whose name holds it;
    ``shares``: only those budgets; ``why``: each cell's cold starts by cause; ``half``
    "B": half B's synthetic days (seeds 200+) in place of half A's."""
    print(
        "\n4. one node's memory as a cache: cold starts of auto at its default (a plan fills "
        "the budget\n   while what fixed 10 minutes would hold fits it) over Greedy-Dual's "
        f"and LRU's, at budgets of\n   fixed 10 minutes' peak (goal <= {GOAL_GD}x and <= "
        f"{GOAL_LRU}x); floor: the cold starts no policy avoids\n   (first calls, and runs "
        "that fit neither beside the busy ones nor on what stays loaded over the\n   "
        "budget); out of reach: floor > the goal's cold starts (proven); unreached: not met, "
        "floor below"
    )
    extra = (", planned, filling" if modes else "") + (", Belady, clairvoyant" if oracle else "")
    head = f"   {'day':<46} {'budget':>7}  {'auto/GD':>7}  {'auto/LRU':>8}"
    print(head + f"  cold: auto, GD, LRU, floor{extra}")
    halves = days(synthetic_functions, synthetic_days)
    if half == "B":  # the other half's synthetic days (seeds 200+), which chose nothing
        halves = (halves[1], {k: v for k, v in halves[0].items() if k.startswith("Azure")})
    sample_b = {k: v for k, v in halves[1].items() if k.startswith("Azure")}
    policies = ("auto", "greedy_dual", "lru") + (("auto_plan", "auto_fill") if modes else ())
    met = cells = 0
    drawn: list[NodeOutcome] = []
    floors: list[Floor] = []
    for name, trace in {**halves[0], **sample_b}.items():
        if day.lower() not in name.lower():
            continue
        peak = fixed_peak_gb(trace)
        for share in shares or SHARES:
            outcomes = [
                simulate_node(trace, p, share * peak, record=why and p in policies[:3])
                for p in policies
            ]
            cold = {o.policy: o.cold_starts for o in outcomes}
            a, gd, lru = cold["auto"], cold["greedy_dual"], cold["lru"]
            good = a <= GOAL_GD * gd and a <= GOAL_LRU * lru
            cells += 1
            met += good
            least = floor(trace, share * peak)
            if name == "Azure sample, half A":
                drawn += outcomes
                floors.append(least)
            shown = [f"{cold[p]:,}" for p in policies[3:]]
            if oracle:
                for known in (ORACLE, CLAIRVOYANT):
                    outcomes.append(simulate_node(trace, known, share * peak, record=why))
                    shown.append(f"{outcomes[-1].cold_starts:,}")
            verdict = ""
            if not good:
                reach = least.cold_starts <= min(GOAL_GD * gd, GOAL_LRU * lru)
                verdict = "  unreached" if reach else "  out of reach"
            print(
                f"   {name:<46} {share:>6.0%}  {a / gd:>6.2f}x  {a / lru:>7.2f}x  {a:,}, {gd:,}, "
                f"{lru:,}, {least.cold_starts:,}{''.join(', ' + x for x in shown)}{verdict}"
            )
            if why:
                causes(trace, [o for o in outcomes if o.colds], share * peak)
    print(f"   {met} of {cells} cells meet the goal at the default")
    if png:
        path = Path(png)
        path = path.with_name(f"{path.stem}-node{path.suffix}")
        title = "Azure sample, half A: cold starts by the node's memory budget"
        print(f"   plot: {node_plot(drawn, path, title, floors=floors)}")
    return met == cells


def live_order() -> bool:
    """5. A live node's budget evictions against the simulator's, side by side."""
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from replaysupport import replay, trace_slice

    trace = trace_slice()
    print(
        f"\n5. a live node under a budget of three instances, replaying {trace.minutes} minutes "
        f"of {len(trace.functions)} functions,\n   against the simulator (budget evictions, "
        "minute and function, in order)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        replayed = replay(Path(tmp), trace)
    print(f"   budget {replayed.budget_bytes:,} bytes; instances {replayed.sizes} bytes")
    print(f"   {'#':>3}  {'live node':<16} {'simulator':<16}")
    rows = max(len(replayed.live), len(replayed.simulated))
    for i in range(rows):
        live = replayed.live[i] if i < len(replayed.live) else None
        sim = replayed.simulated[i] if i < len(replayed.simulated) else None
        cells = [f"min {e[0]:>3} {e[1]}" if e else "-" for e in (live, sim)]
        print(f"   {i + 1:>3}  {cells[0]:<16} {cells[1]:<16}{'' if live == sim else '  differ'}")
    verdict = "match" if replayed.matches else "DIFFER"
    print(f"   {verdict}: {len(replayed.live)} live, {len(replayed.simulated)} simulated")
    return replayed.matches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--synthetic", type=int, default=300, help="functions of each synthetic day"
    )
    parser.add_argument("--days", type=int, default=2, help="days of each synthetic trace")
    parser.add_argument("--seed", type=int, default=1, help="seed of the frontier's trace")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--checks", default="1,2,3,4,5", help="which checks to run (comma-separated numbers)"
    )
    parser.add_argument("--plot", metavar="PNG", help="draw the sample's frontier here")
    parser.add_argument(
        "--oracle",
        action="store_true",
        help="check 4: Belady's evictions and a clairvoyant planner too (slower)",
    )
    parser.add_argument(
        "--modes",
        action="store_true",
        help="check 4: auto never and always filling the budget too, beside the default (slower)",
    )
    parser.add_argument(
        "--day", default="", help="check 4: only the days whose name holds this ('half B')"
    )
    parser.add_argument(
        "--budgets",
        default="",
        help="check 4: only these budgets, in %% of fixed 10 minutes' peak (25,50)",
    )
    parser.add_argument(
        "--half",
        choices=("A", "B"),
        default="A",
        help="check 4: whose synthetic days (B: seeds 200+, which chose nothing)",
    )
    parser.add_argument(
        "--causes",
        action="store_true",
        help="check 4: each cell's cold starts by cause, and how many the floor's oracle avoids",
    )
    args = parser.parse_args()
    checks = {int(c) for c in args.checks.split(",")}
    started = time.perf_counter()
    price = PolicyConfig().cold_start_price_mean_s
    print(
        f"auto's default price of a cold start: {price:,.0f} s of the node's mean instance; "
        "ratios against fixed 10 min\n"
    )
    ok = True
    if 1 in checks:
        ok &= carries_over(args.synthetic, args.days, args.workers)
    if 2 in checks:
        ok &= frontier(
            "2. the frontier on the Azure sample (1 day, 330 functions)",
            sample(),
            args.workers,
            args.plot,
        )
    if 4 in checks:
        shares = tuple(float(b) / 100 for b in args.budgets.split(",") if b.strip())
        ok &= node_memory(
            args.synthetic,
            args.days,
            args.oracle,
            args.modes,
            args.plot,
            day=args.day,
            shares=shares,
            why=args.causes,
            half=args.half,
        )
    if 3 in checks:
        made = synthetic(args.synthetic, days=3, seed=args.seed)
        title = f"3. the frontier on a synthetic trace (3 days, {args.synthetic:,} functions)"
        ok &= frontier(title, made, args.workers, None)
    if 5 in checks:
        ok &= live_order()
    print(
        f"\n{'all checks hold' if ok else 'A CHECK FAILED'} ({time.perf_counter() - started:.0f} s)"
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
