"""fnrt at two commits, head to head: the same model, the same load, alternating runs.

    python bench/ab.py --old REV [--connections 32] [--duration-s 5] [--rounds 8] [--trace]

Checks ``REV`` out into a temporary worktree and serves the ``mlp`` example
from it (its ``fnrt`` packages put first on ``PYTHONPATH``, the same virtual
environment otherwise) beside a server of this checkout. Both run at once
but only one is under load at a time: ``wrk`` alternates between them every
``--duration-s`` seconds, so drift of the machine hits both alike. Prints
each server's requests/s per round and the ratio of the medians, new / old,
and the CPU each server (its worker processes included) spent per request.
``--trace`` serves both with tracing on at 100%, exporting to an OTLP
collector on 127.0.0.1 that drops what it gets (``tracing.py``'s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from loadgen import ROOT, copy_mlp, deploy, require_wrk, start_fnrt, write_script, wrk

from tracing import start_sink

FOLDERS = ("client", "functions", "loader", "runtime", "tracing", "edge")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the commit to compare this checkout with")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration-s", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--trace", action="store_true", help="both with tracing on at 100%%")
    args = parser.parse_args()
    require_wrk()
    work = Path(tempfile.mkdtemp(prefix="fnrt-bench-ab-"))
    tree = work / "old-tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "-q", str(tree), args.old], check=True
    )
    overlay = work / "overlay" / "fnrt"  # import fnrt.* from the old tree first
    overlay.mkdir(parents=True)
    for folder in FOLDERS:
        (overlay / folder).symlink_to(tree / folder)
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = []
    serve_args: list[str] = []
    if args.trace:
        collector, sink = start_sink()
        procs.append(sink)
        serve_args = ["--trace", "otlp", "--trace-endpoint", collector, "--trace-sample", "1.0"]
    try:
        example, _ = copy_mlp(work)
        urls, pids = {}, {}
        for name, extra in (("old", {"PYTHONPATH": str(overlay.parent)}), ("new", {})):
            (work / name).mkdir()
            url, proc = start_fnrt(
                str(work / name / "store"), work / name / "cache", env | extra, *serve_args
            )
            procs.append(proc)
            deploy(url, example)
            urls[name] = f"{url}/v1/functions/mlp/invoke"
            pids[name] = proc.pid
        x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
        body = json.dumps({"x": x.tolist()}).encode()
        script = write_script(work, "json", "application/json", body)
        for url in urls.values():
            wrk(url, script, args.connections, 2)  # warm up: loads each instance
        rps: dict[str, list[float]] = {name: [] for name in urls}
        cpu: dict[str, list[float]] = {name: [] for name in urls}
        for _ in range(args.rounds):
            for name, url in urls.items():
                result = wrk(url, script, args.connections, args.duration_s, pids[name])
                rps[name].append(result.rps)
                cpu[name].append(result.cpu_us or 0.0)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)])
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\nmlp, JSON, {args.connections} connections, {args.rounds} x {args.duration_s} s each\n"
    )
    for name, values in rps.items():
        print(f"{name:<4} requests/s per round: {[round(v) for v in values]}")
    for name, values in cpu.items():
        print(
            f"{name:<4} CPU us/request per round: {[round(v) for v in values]}, "
            f"median {statistics.median(values):.0f}"
        )
    per_round = [round(n / o, 3) for n, o in zip(rps["new"], rps["old"], strict=True)]
    ratio = statistics.median(rps["new"]) / statistics.median(rps["old"])
    print(f"\nnew / old per round: {per_round}")
    print(f"new ({_head()}) / old ({args.old}) requests/s, medians: {ratio:.3f}x")


def _head() -> str:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() or "this checkout"


if __name__ == "__main__":
    main()
