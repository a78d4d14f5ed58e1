"""Swapping model versions under load: time to full traffic, and latency during the swap.

    python bench/swap.py [--connections 32] [--duration-s 8] [--rounds 2]

One ``fnrt serve`` serves ``examples/mlp``; ``wrk`` keeps it busy with
single-row msgpack invokes. Each round measures three phases of
``--duration-s`` each, with the same load:

- ``steady``: no deploy (the baseline);
- ``immediate``: one second in, ``fnrt deploy`` publishes new weights, the
  server loads and warms them (blue/green), then moves all traffic at once;
- ``canary``: the same with ``--policy canary`` (10% -> 50% -> 100%, 1 s dwell).

It prints, per phase, requests/s, p50/p99 and non-2xx responses (every one
would be a dropped request), the p99 ratio against ``steady`` measured in the
same round, and the time from starting ``fnrt deploy`` to the new version
having 100% of the traffic.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import msgpack
import msgpack_numpy
import numpy as np
from loadgen import BIN, Result, deploy, mlp_server, require_wrk, write_script, wrk

CANARY = """
steps_percent = [10, 50, 100]
dwell_s = 1.0
min_requests = 20
"""


def variant(example: Path, work: Path, seed: int) -> Path:
    """A copy of the example with weights made from ``seed`` (a new version)."""
    folder = work / f"mlp-{seed}"
    shutil.copytree(example, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    subprocess.run(
        [
            sys.executable,
            str(folder / "make_weights.py"),
            "--out",
            str(folder / "weights.safetensors"),
            "--seed",
            str(seed),
        ],
        check=True,
        capture_output=True,
    )
    manifest = folder / "fnrt.toml"
    text = manifest.read_text()
    if "[rollout]" not in text:
        text += "\n[rollout]\n"
    manifest.write_text(text.replace("[rollout]\n", "[rollout]\n" + CANARY.lstrip(), 1))
    return folder


def traffic(server: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{server}/v1/functions/mlp/versions", timeout=10) as r:
        listing = json.loads(r.read())
    return dict(listing["traffic"])


def swap(server: str, folder: Path, policy: str, delay_s: float, out: dict[str, float]) -> None:
    """After ``delay_s``, deploy ``folder``; record seconds until it has all traffic."""
    time.sleep(delay_s)
    started = time.monotonic()
    argv = [str(BIN / "fnrt"), "deploy", str(folder), "--server", server, "-q", "--json"]
    argv += ["--policy", policy]
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    version = json.loads(done.stdout)["version"]
    while traffic(server) != {version: 100}:
        if time.monotonic() - started > 120:  # a canary that rolled back never gets there
            out["to_full_traffic_s"] = float("nan")
            return
        time.sleep(0.02)
    out["to_full_traffic_s"] = time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration-s", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    require_wrk()

    with mlp_server("fnrt-bench-swap-") as (work, example, server):
        deploy(server, variant(example, work, 0))
        x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
        body = msgpack.packb({"x": x}, default=msgpack_numpy.encode)
        url = f"{server}/v1/functions/mlp/invoke"
        script = write_script(work, "invoke", "application/msgpack", body)
        wrk(url, script, args.connections, 2)  # warm up

        phases = ("steady", "immediate", "canary")
        results: dict[str, list[Result]] = {p: [] for p in phases}
        swaps: dict[str, list[float]] = {p: [] for p in phases[1:]}
        seed = 1
        for _ in range(args.rounds):
            for phase in phases:
                timing: dict[str, float] = {}
                thread = None
                if phase != "steady":
                    folder = variant(example, work, seed)
                    seed += 1
                    thread = threading.Thread(
                        target=swap, args=(server, folder, phase, 1.0, timing)
                    )
                    thread.start()
                results[phase].append(wrk(url, script, args.connections, args.duration_s))
                if thread is not None:
                    thread.join()
                    swaps[phase].append(timing["to_full_traffic_s"])

        print(
            f"\nmlp example, {args.connections} connections, {args.duration_s}s a phase, "
            f"{args.rounds} rounds (per-round figures; ratios against that round's steady)\n"
        )
        print(
            f"{'phase':<10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'non-2xx':>8} "
            f"{'p99/steady':>11} {'deploy->100%':>13}"
        )
        for i in range(args.rounds):
            base = results["steady"][i]
            for phase in phases:
                r = results[phase][i]
                took = f"{swaps[phase][i]:.2f} s" if phase in swaps else "-"
                print(
                    f"{phase:<10} {r.rps:>8.0f} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f} {r.errors:>8} "
                    f"{r.p99_ms / base.p99_ms:>10.2f}x {took:>13}"
                )
        for phase in phases[1:]:
            ratios = [
                d.p99_ms / s.p99_ms for d, s in zip(results[phase], results["steady"], strict=True)
            ]
            print(
                f"{phase}: deploy -> 100% traffic median {statistics.median(swaps[phase]):.2f} s; "
                f"p99 during / steady median {statistics.median(ratios):.2f}x; "
                f"non-2xx {sum(r.errors for r in results[phase])}"
            )


if __name__ == "__main__":
    main()
