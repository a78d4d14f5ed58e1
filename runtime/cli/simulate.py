"""``fnrt simulate``: replay an invocation trace through the keep-alive policies."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from fnrt.functions.errors import FnrtError
from fnrt.functions.extras import require


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

    if args.plot:  # before minutes of simulating, not after
        require("matplotlib", "--plot")
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
    if args.nodes:
        return _fleet(args, trace, policies)
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


def _fleet(args: argparse.Namespace, trace: Any, policies: list[Any]) -> int:
    from fnrt.runtime.prewarm.fleet import FleetConfig, Routing, simulate_fleet
    from fnrt.runtime.prewarm.policies import Policy
    from fnrt.runtime.prewarm.report import fleet_plot, fleet_table

    if len(policies) != 1 and args.policy:
        raise FnrtError("a fleet runs one policy: give --policy once")
    policy = policies[0] if args.policy else Policy.AUTO
    try:
        configs = [
            FleetConfig(
                nodes,
                Routing(routing),
                memory_budget_mb=args.node_memory_gb * 1024,
                disk_budget_mb=args.node_disk_gb * 1024,
                policy=policy,
            )
            for nodes in args.nodes
            for routing in args.routing or ["hash", "round_robin"]
        ]
    except ValueError as exc:
        raise FnrtError(str(exc)) from None
    started = time.perf_counter()
    outcomes = [simulate_fleet(trace, config) for config in configs]
    took = time.perf_counter() - started
    print(fleet_table(outcomes))
    print(
        f"\n{trace.counts.shape[0]:,} functions x {trace.minutes:,} minutes, {policy.value} "
        f"keep-alive, {args.node_memory_gb:g} GB memory and {args.node_disk_gb:g} GB disk "
        f"per node, {sum(o.invocations for o in outcomes[:1]):,} invocations, "
        f"{len(outcomes)} runs in {took:.1f}s"
    )
    if args.plot:
        print(f"plot: {fleet_plot(outcomes, Path(args.plot))}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay an invocation trace through the keep-alive policies",
        description="Replay a trace in the Azure Functions 2019 layout "
        "(invocations_per_function_md.anon.d*.csv, day files in order) through the same "
        "keep-alive and pre-warm policies the server uses, and report per policy the "
        "cold-start percentage (overall and the 75th-percentile function), the memory "
        "kept idle (GB-hours with --memory, else instance-hours) and the pre-warms "
        "never used. --synthetic N makes up a trace of N functions instead. With --nodes, "
        "replay it over a fleet instead: each node with its own memory (L1) and disk (L2) "
        "budgets and the keep-alive policy on the calls it gets, calls routed by hash, "
        "round robin or least loaded; reports cold starts by tier (L2: the node's disk, "
        "L3: the store), fetches from the store, memory held and load imbalance.",
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
    p.add_argument(
        "--nodes", type=int, nargs="+", metavar="N", help="simulate fleets of N nodes (e.g. 4 16)"
    )
    p.add_argument(
        "--routing",
        nargs="+",
        choices=["hash", "round_robin", "least_loaded"],
        help="how a fleet routes calls (default: hash round_robin)",
    )
    p.add_argument(
        "--node-memory-gb", type=float, default=32.0, help="L1 budget per node (default 32)"
    )
    p.add_argument(
        "--node-disk-gb", type=float, default=200.0, help="L2 budget per node (default 200)"
    )
    p.add_argument("--plot", metavar="PNG", help="draw cold starts against idle memory to PNG")
    p.set_defaults(func=cmd_simulate)
