"""``fnrt simulate``: replay an invocation trace through the keep-alive policies."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from fnrt.functions.errors import FnrtError
from fnrt.functions.extras import require
from fnrt.runtime.cli.options import Listed, flat

POLICIES = ("fixed", "histogram", "time_of_day", "trend", "auto")
DEFAULT_KEEP_ALIVE_MIN = (5, 10, 20, 60)
#: ``auto``'s prices of a cold start with --plot (seconds of the mean instance): its curve,
#: around the default (4,000)
PLOT_PRICES_MEAN_S = (1000.0, 2000.0, 4000.0, 8000.0, 16000.0)


@click.command(short_help="replay an invocation trace through the keep-alive policies")
@click.option(
    "--trace",
    "trace_files",
    type=Listed(click.Path(exists=True, dir_okay=False)),
    multiple=True,
    metavar="FILE[,FILE...]",
    help="day files, in order (comma-separated, or --trace repeated)",
)
@click.option("--memory", metavar="FILE", help="app memory file (AverageAllocatedMb)")
@click.option("--synthetic", type=int, metavar="N", help="simulate a made-up trace of N functions")
@click.option("--days", type=int, default=1, show_default=True, help="days of the synthetic trace")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the synthetic trace")
@click.option("--write", metavar="FOLDER", help="also write the synthetic trace's day files")
@click.option(
    "--policy",
    "policy_names",
    type=Listed(click.Choice(list(POLICIES))),
    multiple=True,
    help="the policies to run (default: all)",
)
@click.option(
    "--keep-alive-min",
    "keep_alive_lists",
    type=Listed(click.IntRange(min=1)),
    multiple=True,
    help="keep-alive lengths for the fixed policy  [default: 5,10,20,60]",
)
@click.option(
    "--price-mean-s",
    "price_s_lists",
    type=Listed(click.FloatRange(min=0)),
    multiple=True,
    metavar="S[,S...]",
    help="auto's prices of a cold start, in seconds of the trace's mean instance kept "
    "loaded (each function's memory from --memory, else 1 GB)  [default: 4000; with "
    "--plot: 1000,2000,4000,8000,16000]",
)
@click.option(
    "--price-gb-s",
    "price_lists",
    type=Listed(click.FloatRange(min=0)),
    multiple=True,
    metavar="GBS[,GBS...]",
    help="or auto's prices in GB·s of idle memory, whatever the functions' sizes",
)
@click.option(
    "--memory-mb",
    type=click.FloatRange(min=1),
    default=150.0,
    show_default=True,
    help="the synthetic trace's median function memory",
)
@click.option(
    "--memory-sigma",
    type=click.FloatRange(min=0),
    default=0.8,
    show_default=True,
    help="the spread of its functions' memory (lognormal sigma)",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0.01),
    default=1.0,
    show_default=True,
    help="its calls, times as many (timers more often, more bursts and rare calls)",
)
@click.option(
    "--burstiness",
    type=click.FloatRange(min=0.01),
    default=1.0,
    show_default=True,
    help="its bursts, times fewer and longer (the same calls, lumpier)",
)
@click.option("--workers", type=int, default=2, show_default=True, help="processes")
@click.option(
    "--nodes",
    "node_lists",
    type=Listed(click.IntRange(min=1)),
    multiple=True,
    metavar="N[,N...]",
    help="simulate fleets of N nodes (e.g. 4,16)",
)
@click.option(
    "--routing",
    "routing_lists",
    type=Listed(click.Choice(["hash", "round_robin", "least_loaded"])),
    multiple=True,
    help="how a fleet routes calls  [default: hash,round_robin]",
)
@click.option(
    "--node-memory-gb",
    "node_memory_lists",
    type=Listed(click.STRING),
    multiple=True,
    metavar="GB[,GB...]",
    help="without --nodes: compare the policies on one node at each memory budget (GB, or "
    "a share of the fixed 10-minute keep-alive's peak: 25%,50%,100%), auto at its default "
    "price in seconds of the node's mean instance as a node has it (the functions planned "
    "for so far); with --nodes: the L1 budget per node  [default with --nodes: 32]",
)
@click.option(
    "--node-disk-gb", type=float, default=200.0, show_default=True, help="L2 budget per node"
)
@click.option("--plot", metavar="PNG", help="draw cold starts against idle memory to PNG")
def simulate(
    trace_files: tuple[list[str], ...],
    memory: str | None,
    synthetic: int | None,
    days: int,
    seed: int,
    write: str | None,
    policy_names: tuple[list[str], ...],
    keep_alive_lists: tuple[list[int], ...],
    price_s_lists: tuple[list[float], ...],
    price_lists: tuple[list[float], ...],
    memory_mb: float,
    memory_sigma: float,
    rate: float,
    burstiness: float,
    workers: int,
    node_lists: tuple[list[int], ...],
    routing_lists: tuple[list[str], ...],
    node_memory_lists: tuple[list[str], ...],
    node_disk_gb: float,
    plot: str | None,
) -> int:
    """Replay an invocation trace through the keep-alive policies.

    The trace is in the Azure Functions 2019 layout
    (invocations_per_function_md.anon.d*.csv, day files in order), replayed
    through the same keep-alive and pre-warm policies the server uses; per
    policy it reports the cold-start percentage (overall and the
    75th-percentile function), the memory kept idle (GB-hours with --memory,
    else instance-hours) and the pre-warms never used. --synthetic N makes up a
    trace of N functions instead, its sizes, rates and burstiness as --memory-mb,
    --memory-sigma, --rate and --burstiness say. auto runs once per price of a cold
    start (--price-mean-s, or --price-gb-s); --plot draws its curve against the fixed
    keep-alives'.

    With --node-memory-gb (and no --nodes), it compares auto, fixed 10 minutes,
    FaasCache's Greedy-Dual and LRU on one node whose memory holds that much,
    each budget in turn: cold starts, evictions by reason (budget, plan, idle),
    memory, and the floor: the cold starts no policy avoids (first calls, and
    calls that do not fit beside the busy instances even loaded in their
    minute); --plot draws cold starts against the budget.

    With --nodes, it replays the trace over a fleet instead: each node with its
    own memory (L1) and disk (L2) budgets and the keep-alive policy on the calls
    it gets, calls routed by hash, round robin or least loaded; it reports cold
    starts by tier (L2: the node's disk, L3: the store), fetches from the store,
    memory held and load imbalance.

    Lists take commas or a repeated option: --nodes 4,16 or --nodes 4 --nodes 16.
    """
    from fnrt.runtime.prewarm.policies import Policy
    from fnrt.runtime.prewarm.report import plot as draw
    from fnrt.runtime.prewarm.report import table
    from fnrt.runtime.prewarm.simulator import simulate as run_policies
    from fnrt.runtime.prewarm.trace import (
        Shape,
        read_app_memory,
        read_invocations,
        write_invocations,
    )
    from fnrt.runtime.prewarm.trace import (
        synthetic as make_synthetic,
    )

    if plot:  # before minutes of simulating, not after
        require("matplotlib", "--plot")
    files = flat(trace_files)
    if synthetic:
        try:
            shape = Shape(memory_mb, memory_sigma, rate, burstiness)
        except ValueError as exc:
            raise FnrtError(str(exc)) from None
        trace = make_synthetic(synthetic, days=days, seed=seed, shape=shape)
        if write:
            paths = write_invocations(trace, Path(write))
            print(f"wrote {len(paths)} day files to {write}", file=sys.stderr)
    elif files:
        trace = read_invocations([Path(p) for p in files])
        if memory:
            read_app_memory(Path(memory), trace)
    else:
        raise FnrtError("give --trace FILE[,FILE...] or --synthetic N")
    chosen = flat(policy_names)
    policies = [Policy(p) for p in chosen] if chosen else list(Policy)
    nodes = flat(node_lists)
    budgets = flat(node_memory_lists)
    if nodes:
        if len(budgets) > 1:
            raise FnrtError("a fleet has one --node-memory-gb")
        memory_gb = _gigabytes(budgets[0]) if budgets else 32.0
        fleet = Fleet(
            nodes, flat(routing_lists) or ["hash", "round_robin"], memory_gb, node_disk_gb
        )
        return _fleet(fleet, trace, policies if chosen else [], plot)
    if budgets:
        return _node(trace, budgets, plot)
    started = time.perf_counter()
    outcomes = run_policies(
        trace,
        policies,
        fixed_keep_alive_min=flat(keep_alive_lists) or list(DEFAULT_KEEP_ALIVE_MIN),
        prices_gb_s=flat(price_lists),
        prices_mean_s=flat(price_s_lists)
        or (PLOT_PRICES_MEAN_S if plot and not price_lists else ()),
        workers=workers,
    )
    took = time.perf_counter() - started
    print(table(outcomes))
    print(
        f"\n{trace.counts.shape[0]:,} functions x {trace.minutes:,} minutes, "
        f"{len(outcomes)} runs in {took:.1f}s"
    )
    if plot:
        print(f"plot: {draw(outcomes, Path(plot))}")
    return 0


def _gigabytes(text: str, peak_gb: float | None = None) -> float:
    """``40`` (GB) or, given the fixed keep-alive's peak, ``50%`` of it."""
    try:
        if text.endswith("%"):
            if peak_gb is None:
                raise FnrtError(f"--node-memory-gb {text}: a share needs no --nodes")
            value = float(text[:-1]) / 100 * peak_gb
        else:
            value = float(text)
    except ValueError:
        raise FnrtError(
            f"--node-memory-gb: {text!r} is not a number of GB or a share (50%)"
        ) from None
    if not value > 0:
        raise FnrtError(f"--node-memory-gb: {text!r} must be more than 0")
    return value


def _node(trace: Any, budgets: list[str], plot: str | None) -> int:
    from fnrt.runtime.prewarm.bound import floor
    from fnrt.runtime.prewarm.node import compare, fixed_peak_gb
    from fnrt.runtime.prewarm.report import node_plot, node_table

    started = time.perf_counter()
    peak = fixed_peak_gb(trace)
    sizes = [_gigabytes(b, peak) for b in budgets]
    outcomes = compare(trace, sizes)
    floors = [floor(trace, b) for b in sizes]
    print(node_table(outcomes, floors))
    print(
        f"\n{trace.counts.shape[0]:,} functions x {trace.minutes:,} minutes, one node; fixed "
        f"10 minutes' peak with no budget: {peak:,.1f} GB; {len(outcomes)} runs in "
        f"{time.perf_counter() - started:.1f}s"
    )
    if plot:
        print(f"plot: {node_plot(outcomes, Path(plot), floors=floors)}")
    return 0


@dataclass(frozen=True)
class Fleet:
    """The fleets ``--nodes`` asks for: every node count under every routing."""

    nodes: list[int]
    routings: list[str]
    node_memory_gb: float
    node_disk_gb: float


def _fleet(fleet: Fleet, trace: Any, policies: list[Any], plot: str | None) -> int:
    from fnrt.runtime.prewarm.fleet import FleetConfig, Routing, simulate_fleet
    from fnrt.runtime.prewarm.policies import Policy
    from fnrt.runtime.prewarm.report import fleet_plot, fleet_table

    if len(policies) > 1:
        raise FnrtError("a fleet runs one policy: give --policy once")
    policy = policies[0] if policies else Policy.AUTO
    try:
        configs = [
            FleetConfig(
                nodes,
                Routing(routing),
                memory_budget_mb=fleet.node_memory_gb * 1024,
                disk_budget_mb=fleet.node_disk_gb * 1024,
                policy=policy,
            )
            for nodes in fleet.nodes
            for routing in fleet.routings
        ]
    except ValueError as exc:
        raise FnrtError(str(exc)) from None
    started = time.perf_counter()
    outcomes = [simulate_fleet(trace, config) for config in configs]
    took = time.perf_counter() - started
    print(fleet_table(outcomes))
    print(
        f"\n{trace.counts.shape[0]:,} functions x {trace.minutes:,} minutes, {policy.value} "
        f"keep-alive, {fleet.node_memory_gb:g} GB memory and {fleet.node_disk_gb:g} GB disk "
        f"per node, {sum(o.invocations for o in outcomes[:1]):,} invocations, "
        f"{len(outcomes)} runs in {took:.1f}s"
    )
    if plot:
        print(f"plot: {fleet_plot(outcomes, Path(plot))}")
    return 0
