"""The simulator's results as a table and as a plot of cold starts against idle memory."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fnrt.runtime.prewarm.simulator import Outcome


def table(outcomes: Sequence[Outcome]) -> str:
    memory = all(o.idle_gb_minutes is not None for o in outcomes)
    head = ["policy", "cold %", "p75 fn cold %", "idle inst-min"]
    head += ["idle GB-min"] if memory else []
    head += ["pre-warms", "unused"]
    rows = [head]
    for o in outcomes:
        row = [
            o.label,
            f"{o.cold_percent:.3f}",
            f"{o.function_percentile(75):.1f}",
            f"{o.idle_minutes:,.0f}",
        ]
        row += [f"{o.idle_gb_minutes:,.0f}"] if memory and o.idle_gb_minutes is not None else []
        row += [f"{o.prewarms:,}", f"{o.prewarms_unused:,}"]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    )


def plot(outcomes: Sequence[Outcome], path: Path, title: str = "") -> Path:
    """Cold-start % against idle memory-time, one point per policy (fixed as a line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    memory = all(o.idle_gb_minutes is not None for o in outcomes)

    def idle(o: Outcome) -> float:
        value = o.idle_gb_minutes if memory and o.idle_gb_minutes is not None else o.idle_minutes
        return value / 60.0

    fig, ax = plt.subplots(figsize=(7, 4.5))
    fixed = sorted((o for o in outcomes if o.label.startswith("fixed")), key=idle)
    if fixed:
        ax.plot(
            [idle(o) for o in fixed],
            [o.cold_percent for o in fixed],
            "o-",
            color="grey",
            label="fixed keep-alive",
        )
        for o in fixed:
            ax.annotate(
                o.label.removeprefix("fixed "),
                (idle(o), o.cold_percent),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=8,
            )
    for o in outcomes:
        if not o.label.startswith("fixed"):
            ax.plot([idle(o)], [o.cold_percent], "s", markersize=8, label=o.label)
    ax.set_xlabel("idle memory, " + ("GB-hours" if memory else "instance-hours"))
    ax.set_ylabel("cold starts, % of invocations")
    ax.set_title(title or "keep-alive policies: cold starts against idle memory")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
