"""Split inference: end-to-end latency by bandwidth, all-server vs all-edge vs split vs planner.

    python bench/edge.py [--rtt-ms 5] [--slowdown 30] [--runs 7] [--plot docs/img/edge-split.png]

One ``fnrt serve`` (its own process) serves ``examples/cnn-split``. An edge
client in this process runs heads on one onnxruntime thread, slowed
``--slowdown`` times (a device slower than this machine), behind a link
emulated on the client side (``Throttled``: ``--rtt-ms`` plus the bytes at
the bandwidth). At each bandwidth it measures the median of ``--runs``
calls for every fixed split (0 = all on the server, the last = all on the
device) and for the planner's choice (``client.run`` with no split: the
client estimates the link from its own requests and plans), in turn, so
bursts of load on a shared machine hit them all alike. It prints the
latencies and, as ratios against the planner measured in the same run,
all-server, all-edge and the best fixed split.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from loadgen import ROOT, deploy, start_fnrt

from fnrt.edge.client import EdgeClient, EdgeConfig
from fnrt.edge.transport import HttpTransport, Throttled

BANDWIDTHS = [50e3, 200e3, 1e6, 5e6, 20e6, 100e6]  # bytes/s: 2,000x from slowest to fastest


def _label(bandwidth: float) -> str:
    return f"{bandwidth / 1e6:g} MB/s" if bandwidth >= 1e6 else f"{bandwidth / 1e3:g} kB/s"


def measure(url: str, cache: Path, bandwidth: float, args: argparse.Namespace) -> dict[str, float]:
    x = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    link = Throttled(HttpTransport(url), bandwidth, args.rtt_ms)
    config = EdgeConfig(cache_dir=cache, emulate_slowdown=args.slowdown)
    with EdgeClient(url, "cnn-split", config, transport=link) as client:
        last = client.splits - 1
        times: list[list[float]] = [[] for _ in range(client.splits + 1)]
        splits = []
        for _ in range(args.runs):  # in turn, so a burst of load hits every split alike
            for k in range(client.splits):
                times[k].append(client.run({"x": x}, split=k).total_ms)
            planned = client.run({"x": x})  # the planner's choice
            times[-1].append(planned.total_ms)
            splits.append(planned.split)
        fixed = [statistics.median(t) for t in times[:-1]]
        if args.verbose:
            plan = client.plan()
            print(f"{_label(bandwidth)}: link {client.link.link}", file=sys.stderr)
            print(f"  predicted {[round(t, 1) for t in plan.predicted_ms]}", file=sys.stderr)
            print(f"  measured  {[round(t, 1) for t in fixed]}", file=sys.stderr)
    best = min(range(len(fixed)), key=fixed.__getitem__)
    return {
        "all_server": fixed[0],
        "all_edge": fixed[last],
        "best_fixed": fixed[best],
        "best_split": best,
        "planner": statistics.median(times[-1]),
        "planner_split": statistics.mode(splits),
        "fixed": fixed,  # type: ignore[dict-item]
    }


def plot(rows: dict[float, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(rows)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key, label, style in [
        ("all_server", "all on the server", "s--"),
        ("all_edge", "all on the device", "^--"),
        ("best_fixed", "best fixed split (tried all)", "o:"),
        ("planner", "planner's choice", "D-"),
    ]:
        ax.plot(xs, [rows[b][key] for b in xs], style, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("link bandwidth (bytes/s)")
    ax.set_ylabel("end-to-end latency (ms, median)")
    ax.set_title("cnn-split: where to cut, by bandwidth")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt-ms", type=float, default=5.0)
    parser.add_argument("--slowdown", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--plot", type=Path, help="write a plot here (PNG)")
    parser.add_argument("--verbose", action="store_true", help="print predicted vs measured")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fnrt-bench-edge-") as tmp:
        work = Path(tmp)
        example = work / "cnn-split"
        shutil.copytree(ROOT / "examples" / "cnn-split", example,
                        ignore=shutil.ignore_patterns("*.onnx", "__pycache__"))  # fmt: skip
        export = [sys.executable, str(example / "export.py"), "--out", str(example)]
        subprocess.run(export, check=True, capture_output=True)
        url, proc = start_fnrt(str(work / "store"), work / "cache", dict(os.environ))
        try:
            deploy(url, example)
            cache = work / "edge"
            with EdgeClient(url, "cnn-split", EdgeConfig(cache_dir=cache)) as warm:
                warm.plan()  # heads into the device's cache once, at full speed
            rows = {b: measure(url, cache, b, args) for b in BANDWIDTHS}
        finally:
            proc.terminate()
            proc.wait(30)
    print(f"cnn-split, device {args.slowdown:g}x slower than this machine, RTT {args.rtt_ms:g} ms,")
    print(f"median of {args.runs} calls; ratio = latency / planner's latency (same run)\n")
    head = ("bandwidth", "all-server", "all-edge", "best fixed", "planner", "srv/pl", "edge/pl",
            "best/pl")  # fmt: skip
    print("{:>10} {:>11} {:>11} {:>15} {:>15} {:>7} {:>7} {:>7}".format(*head))
    for bandwidth, r in rows.items():
        print(
            f"{_label(bandwidth):>10} {r['all_server']:>8.1f} ms {r['all_edge']:>8.1f} ms "
            f"{r['best_fixed']:>7.1f} ms (k={r['best_split']:.0f}) "
            f"{r['planner']:>7.1f} ms (k={r['planner_split']:.0f}) "
            f"{r['all_server'] / r['planner']:>7.2f} {r['all_edge'] / r['planner']:>7.2f} "
            f"{r['best_fixed'] / r['planner']:>7.2f}"
        )
    print("\nevery fixed split (ms):")
    for bandwidth, r in rows.items():
        fixed = r["fixed"]
        print(f"{_label(bandwidth):>10} " + " ".join(f"{t:7.1f}" for t in fixed))  # type: ignore[attr-defined]
    if args.plot:
        plot(rows, args.plot)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
