"""A long run at a steady load: does anything grow or drift?

    python bench/soak.py [--minutes 10] [--load 0.8] [--connections 32] [--plot PNG]

Serves the ``mlp`` example, measures its capacity (requests/s with ``wrk`` at
``--connections``), then holds ``--load`` of it for ``--minutes``: each of
wrk's connections waits between requests (wrk's ``delay()``) so the offered
rate is fixed. Every minute it reads the server's resident memory (its worker
processes included), open file descriptors and threads, and the minute's
p50/p99 latency. It prints each minute, then the last minute against the
first as ratios: memory growth, descriptor and thread counts, p99 drift.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from loadgen import DELAY, copy_mlp, deploy, require_wrk, start_fnrt, write_script, wrk


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and every process under it (its workers)."""
    total = 0
    for child in [pid, *_descendants(pid)]:
        try:
            status = Path(f"/proc/{child}/status").read_text()
        except FileNotFoundError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def _descendants(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, IndexError):
                continue
            if int(fields[1]) == pid:
                out += [int(entry.name), *_descendants(int(entry.name))]
    return out


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--load", type=float, default=0.8, help="fraction of measured capacity")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--plot", type=Path, help="write the minutes as a PNG")
    args = parser.parse_args()
    require_wrk()
    work = Path(tempfile.mkdtemp(prefix="fnrt-soak-"))
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = None
    try:
        example, _ = copy_mlp(work)
        url, proc = start_fnrt(str(work / "store"), work / "cache", env, "--no-request-log")
        deploy(url, example)
        invoke = f"{url}/v1/functions/mlp/invoke"
        x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
        body = json.dumps({"x": x.tolist()}).encode()
        script = write_script(work, "json", "application/json", body)
        wrk(invoke, script, args.connections, 3)  # warm up
        full = wrk(invoke, script, args.connections, 10)
        capacity = full.rps
        rate = capacity * args.load
        # each connection waits its delay after each answer: its period is the
        # delay plus the latency (about the p50 at capacity, an upper bound below it)
        delay_ms = max(int(args.connections * 1000 / rate - full.p50_ms / 2), 1)
        paced = work / "paced.lua"
        paced.write_text(script.read_text() + DELAY.format(delay_ms=delay_ms))
        print(
            f"capacity {capacity:.0f} req/s at {args.connections} connections; holding "
            f"{args.load:.0%} ({rate:.0f} req/s): {delay_ms} ms between a connection's "
            f"requests, for {args.minutes} min (the req/s column is what it got)\n"
        )
        header = ("min", "req/s", "p50 ms", "p99 ms", "RSS MiB", "fds", "thr")
        print("{:>3} {:>7} {:>7} {:>7} {:>8} {:>5} {:>4}".format(*header))
        rows = []
        for minute in range(1, args.minutes + 1):
            result = wrk(invoke, paced, args.connections, 60)
            row = {
                "minute": minute,
                "rps": result.rps,
                "p50_ms": result.p50_ms,
                "p99_ms": result.p99_ms,
                "errors": result.errors,
                "rss_mib": rss_bytes(proc.pid) / 2**20,
                "fds": descriptors(proc.pid),
                "threads": threads(proc.pid),
            }
            rows.append(row)
            print(
                f"{minute:>3} {row['rps']:>7.0f} {row['p50_ms']:>7.2f} {row['p99_ms']:>7.2f} "
                f"{row['rss_mib']:>8.1f} {row['fds']:>5} {row['threads']:>4}",
                flush=True,
            )
        first, last = rows[0], rows[-1]
        print(
            f"\nlast / first minute: RSS {last['rss_mib'] / first['rss_mib']:.3f}x "
            f"({last['rss_mib'] - first['rss_mib']:+.1f} MiB), "
            f"fds {first['fds']} -> {last['fds']}, "
            f"threads {first['threads']} -> {last['threads']}, "
            f"p99 {last['p99_ms'] / first['p99_ms']:.2f}x, "
            f"errors {sum(r['errors'] for r in rows)}"
        )
        if args.plot:
            plot(rows, args.plot)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def plot(rows: list[dict[str, float]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r["minute"] for r in rows]
    fig, (mem, lat) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    mem.plot(minutes, [r["rss_mib"] for r in rows], marker="o")
    mem.set_ylabel("RSS, MiB (workers included)")
    mem.set_ylim(0, max(r["rss_mib"] for r in rows) * 1.25)  # growth shows against zero
    mem.ticklabel_format(axis="y", useOffset=False)
    lat.plot(minutes, [r["p50_ms"] for r in rows], marker="o", label="p50")
    lat.plot(minutes, [r["p99_ms"] for r in rows], marker="o", label="p99")
    lat.set_ylabel("latency, ms")
    lat.set_xlabel("minute")
    lat.legend()
    fig.suptitle("fnrt soak: mlp at a fixed share of capacity")
    fig.tight_layout()
    fig.savefig(out)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
