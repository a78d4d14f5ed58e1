"""``fnrt simulate``: replay an invocation trace through the keep-alive policies."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from fnrt.functions.errors import FnrtError


def cmd_simulate(args: argparse.Namespace) -> int:
    from fnrt.runtime.prewarm.policies import Policy
    from fnrt.runtime.prewarm.report import plot, table
    from fnrt.runtime.prewarm.simulator import simulate
    from fnrt.runtime.prewarm.trace import (
        read_app_memory,
        read_invocations,
        synthetic,
        write_invocations,
    )

    if args.synthetic:
        trace = synthetic(args.synthetic, days=args.days, seed=args.seed)
        if args.write:
            paths = write_invocations(trace, Path(args.write))
            print(f"wrote {len(paths)} day files to {args.write}", file=sys.stderr)
    elif args.trace:
        trace = read_invocations([Path(p) for p in args.trace])
        if args.memory:
            read_app_memory(Path(args.memory), trace)
    else:
        raise FnrtError("give --trace FILE [FILE ...] or --synthetic N")
    try:
        policies = [Policy(p) for p in args.policy] if args.policy else list(Policy)
    except ValueError as exc:
        raise FnrtError(str(exc)) from None
    started = time.perf_counter()
    outcomes = simulate(
        trace, policies, fixed_keep_alive_min=args.keep_alive_min, workers=args.workers
    )
    took = time.perf_counter() - started
    print(table(outcomes))
    print(
        f"\n{trace.counts.shape[0]:,} functions x {trace.minutes:,} minutes, "
        f"{len(outcomes)} runs in {took:.1f}s"
    )
    if args.plot:
        print(f"plot: {plot(outcomes, Path(args.plot))}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay an invocation trace through the keep-alive policies",
        description="Replay a trace in the Azure Functions 2019 layout "
        "(invocations_per_function_md.anon.d*.csv, day files in order) through the same "
        "keep-alive and pre-warm policies the server uses, and report per policy the "
        "cold-start percentage (overall and the 75th-percentile function), the memory "
        "kept idle (GB-minutes with --memory, else instance-minutes) and the pre-warms "
        "never used. --synthetic N makes up a trace of N functions instead.",
    )
    p.add_argument("--trace", nargs="+", metavar="FILE", help="day files, in order")
    p.add_argument("--memory", metavar="FILE", help="app memory file (AverageAllocatedMb)")
    p.add_argument(
        "--synthetic", type=int, metavar="N", help="simulate a made-up trace of N functions"
    )
    p.add_argument("--days", type=int, default=1, help="days of the synthetic trace (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic trace")
    p.add_argument("--write", metavar="FOLDER", help="also write the synthetic trace's day files")
    p.add_argument(
        "--policy",
        action="append",
        choices=["fixed", "histogram", "time_of_day", "trend", "auto"],
        help="a policy to run; repeatable (default: all)",
    )
    p.add_argument(
        "--keep-alive-min",
        type=int,
        nargs="+",
        default=[5, 10, 20, 60],
        help="keep-alive lengths for the fixed policy (default 5 10 20 60)",
    )
    p.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    p.add_argument("--plot", metavar="PNG", help="draw cold starts against idle memory to PNG")
    p.set_defaults(func=cmd_simulate)
