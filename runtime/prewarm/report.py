"""The simulators' results: tables, and plots (cold starts against idle memory for the
policies; cold starts by tier, memory and imbalance for fleets)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fnrt.functions.extras import require
from fnrt.runtime.prewarm.bound import Floor
from fnrt.runtime.prewarm.fleet import FleetOutcome
from fnrt.runtime.prewarm.node import NodeOutcome
from fnrt.runtime.prewarm.simulator import Outcome


def table(outcomes: Sequence[Outcome]) -> str:
    """One row per policy; idle memory in hours, as the plot and the fleet table."""
    memory = all(o.idle_gb_minutes is not None for o in outcomes)
    head = ["policy", "cold %", "p75 fn cold %", "idle inst-h"]
    head += ["idle GB-h"] if memory else []
    head += ["pre-warms", "unused"]
    rows = [head]
    for o in outcomes:
        row = [
            o.label,
            f"{o.cold_percent:.3f}",
            f"{o.function_percentile(75):.1f}",
            f"{o.idle_minutes / 60:,.0f}",
        ]
        if memory and o.idle_gb_minutes is not None:
            row += [f"{o.idle_gb_minutes / 60:,.0f}"]
        row += [f"{o.prewarms:,}", f"{o.prewarms_unused:,}"]
        rows.append(row)
    return _aligned(rows)


def plot(outcomes: Sequence[Outcome], path: Path, title: str = "") -> Path:
    """Cold-start % against idle memory-time, one point per policy; fixed keep-alives and
    ``auto`` at several prices as lines."""
    plt = _pyplot()

    memory = all(o.idle_gb_minutes is not None for o in outcomes)

    def idle(o: Outcome) -> float:
        value = o.idle_gb_minutes if memory and o.idle_gb_minutes is not None else o.idle_minutes
        return value / 60.0

    fig, ax = plt.subplots(figsize=(7, 4.5))
    # fixed keep-alives, and auto at several prices of a cold start: a curve each
    for prefix, style, color, label, below in (
        ("fixed ", "o-", "grey", "fixed keep-alive", False),
        ("auto ", "D-", "tab:blue", "auto, by price of a cold start", True),
    ):
        curve = sorted((o for o in outcomes if o.label.startswith(prefix)), key=idle)
        if not curve:
            continue
        points = [(idle(o), o.cold_percent) for o in curve]
        ax.plot(*zip(*points, strict=True), style, color=color, label=label)
        for o, point in zip(curve, points, strict=True):
            ax.annotate(
                o.label.removeprefix(prefix),
                point,
                textcoords="offset points",
                xytext=(4, -12 if below else 4),
                fontsize=8,
                color=color if below else None,
            )
    # hollow markers, each smaller than the last: policies at the same point stay visible
    others = [o for o in outcomes if not o.label.startswith(("fixed ", "auto "))]
    for i, o in enumerate(others):
        ax.plot(
            [idle(o)],
            [o.cold_percent],
            "sDo^vP"[i % 6],
            markersize=14 - 2 * (i % 5),
            markerfacecolor="none",
            markeredgewidth=1.8,
            label=o.label,
        )
    ax.set_xlabel("idle memory, " + ("GB-hours" if memory else "instance-hours"))
    ax.set_ylabel("cold starts, % of invocations")
    if all(o.cold_percent > 0 for o in outcomes):  # the low end is where policies differ
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(plt.FuncFormatter(_twos_and_fives))
    ax.set_title(title or "keep-alive policies: cold starts against idle memory")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _saved(plt, fig, path)


def fleet_table(outcomes: Sequence[FleetOutcome]) -> str:
    """One row per fleet run: cold starts by tier, fetches, memory, imbalance."""
    rows = [list(outcomes[0].row())] if outcomes else [[]]
    rows += [list(o.row().values()) for o in outcomes]
    return _aligned(rows)


def fleet_plot(outcomes: Sequence[FleetOutcome], path: Path) -> Path:
    """Cold starts by tier, memory held and load imbalance, one bar per fleet run."""
    plt = _pyplot()

    labels = [f"{o.config.routing.value.replace('_', chr(10))}\n{o.config.nodes}" for o in outcomes]
    x = range(len(outcomes))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.6))
    width = 0.4
    axes[0].bar([i - width / 2 for i in x], [o.cold_l2 for o in outcomes], width,
                label="cold starts from L2 (node disk)", color="tab:blue")  # fmt: skip
    axes[0].bar([i + width / 2 for i in x], [o.l3_fetches for o in outcomes], width,
                label="fetches from L3 (the store)", color="tab:red")  # fmt: skip
    axes[0].set_yscale("log")
    axes[0].set_title("cold starts and store fetches (log)")
    axes[0].legend(fontsize=8)
    axes[1].bar(x, [o.memory_gb_hours for o in outcomes], color="tab:green")
    axes[1].set_title("memory held by instances, GB-hours")
    axes[2].bar(x, [o.imbalance for o in outcomes], color="tab:orange")
    axes[2].axhline(1.0, color="grey", linewidth=0.8)
    axes[2].set_title("busiest node's calls / mean")
    for ax in axes:
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("routing across a fleet (routing, nodes): what the nodes load, fetch and hold")
    return _saved(plt, fig, path)


def _aligned(rows: Sequence[Sequence[str]], left: int = 0) -> str:
    """``rows`` as a text table: each column as wide as its widest cell, column
    ``left`` flush left and the others right (numbers)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == left else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    )


def _twos_and_fives(value: float, _: object) -> str:
    """Minor tick labels of a log axis: 0.02 and 0.05, not every one between."""
    leading = f"{value:.0e}"[0]
    return f"{value:g}" if leading in "25" else ""


def _saved(plt: Any, fig: Any, path: Path) -> Path:
    """``fig`` laid out, written to ``path`` (its folder made) and closed; ``path``."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _pyplot() -> Any:
    """matplotlib's pyplot, drawing to files (``fnrt[plot]``)."""
    matplotlib = require("matplotlib", "--plot")
    matplotlib.use("Agg")
    return require("matplotlib.pyplot", "--plot")


def node_table(outcomes: Sequence[NodeOutcome], floors: Sequence[Floor] = ()) -> str:
    """One row per (budget, policy): cold starts, evictions by reason, memory; with
    ``floors``, a row per budget with the cold starts no policy avoids
    (:func:`~fnrt.runtime.prewarm.bound.floor`)."""
    head = ["budget GB", "policy", "cold starts", "cold %", "vs auto"]
    head += ["evicted: budget", "plan", "idle", "pre-warms", "idle GB-h", "peak GB"]
    rows = [head]
    autos = {o.budget_gb: o.cold_starts for o in outcomes if o.policy == "auto"}
    by_budget = {f.budget_gb: f for f in floors}
    for o in outcomes:
        fl = by_budget.pop(o.budget_gb, None)
        if fl is not None:
            base = autos.get(o.budget_gb)
            rows.append(
                ["none" if fl.budget_gb is None else f"{fl.budget_gb:,.1f}", "floor"]
                + [f"{fl.cold_starts:,}", "", f"{fl.cold_starts / base:.2f}x" if base else ""]
                + [""] * 6
            )
        base = autos.get(o.budget_gb)
        rows.append(
            [
                "none" if o.budget_gb is None else f"{o.budget_gb:,.1f}",
                o.policy,
                f"{o.cold_starts:,}",
                f"{o.cold_percent:.3f}",
                f"{o.cold_starts / base:.2f}x" if base else "",
                f"{o.evictions['budget']:,}",
                f"{o.evictions['plan']:,}",
                f"{o.evictions['idle']:,}",
                f"{o.prewarms:,}",
                f"{o.idle_gb_minutes / 60:,.0f}",
                f"{o.peak_gb:,.1f}",
            ]
        )
    return _aligned(rows, left=1)


def node_plot(
    outcomes: Sequence[NodeOutcome], path: Path, title: str = "", floors: Sequence[Floor] = ()
) -> Path:
    """Cold starts against the node's memory budget, one line per policy (and, dashed,
    the floor no policy goes below)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bounded = sorted((f.budget_gb, f.cold_starts) for f in floors if f.budget_gb is not None)
    if bounded:
        ax.plot(*zip(*bounded, strict=True), "k--", label="floor (any policy)")
    for policy in dict.fromkeys(o.policy for o in outcomes):
        points = sorted(
            (o.budget_gb, o.cold_starts)
            for o in outcomes
            if o.policy == policy and o.budget_gb is not None
        )
        if points:
            ax.plot(*zip(*points, strict=True), "o-", label=policy)
    ax.set_xlabel("node memory budget, GB")
    ax.set_ylabel("cold starts")
    ax.set_yscale("log")
    ax.set_title(title or "the node's memory as a cache: cold starts by budget")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _saved(plt, fig, path)
