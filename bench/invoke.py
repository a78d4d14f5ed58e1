"""fnrt serving the ``mlp`` example versus a bare Starlette endpoint, the leanest
batching server, and the HTTP floor.

    python bench/invoke.py [--connections 32] [--duration-s 8] [--rounds 3] [--plot FILE.png]
                           [--no-breakdown]

All four run on uvicorn with uvloop and httptools, one process each, with
``OMP_NUM_THREADS=1``: fnrt (request log on, as in production), a bare
Starlette endpoint calling the same model inline, the leanest batching server
(``lean_app.py``: body, parse, array, a future, batches of the same model run
inline on the event loop, and nothing else: the floor of the design), and a
raw ASGI app that reads the body and answers a constant one (``raw_app.py``:
the floor the stack allows, no model); ``wrk`` (Debian package ``wrk``) drives
them with the same body at the same concurrency. Each configuration runs
``--rounds`` times, interleaved so drift hits all alike; the median round is
reported with the ratios of fnrt to each of the others (absolute numbers move
with the machine), and the lean server's to the raw floor: how much of the
floor any batching server in Python keeps.

Then (unless ``--no-breakdown``) py-spy samples the raw app's and fnrt's event
loop thread through one more JSON run each, and the output shows where a
request's time goes there, part by part, in microseconds a request, beside the
raw app's whole figure (``breakdown.py``; py-spy from the package index).
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

import msgpack
import msgpack_numpy
import numpy as np
from breakdown import print_breakdown, profile_under_load
from loadgen import (
    Result,
    copy_mlp,
    deploy,
    median,
    require_wrk,
    start_bare,
    start_fnrt,
    start_lean,
    start_raw,
    write_script,
    wrk,
)

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration-s", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plot", type=Path, help="write a bar chart of requests/s to this PNG")
    parser.add_argument(
        "--no-breakdown",
        dest="breakdown",
        action="store_false",
        help="skip the py-spy breakdown of a request's time on the event loop's thread",
    )
    args = parser.parse_args()
    require_wrk()

    work = Path(tempfile.mkdtemp(prefix="fnrt-bench-"))
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        example, weights = copy_mlp(work)

        fnrt, proc = start_fnrt(str(work / "store"), work / "cache", env)
        procs.append(proc)
        bare, proc = start_bare(example, weights, env)
        procs.append(proc)
        lean, proc = start_lean(example, weights, env)
        procs.append(proc)
        raw, proc = start_raw(env)
        procs.append(proc)
        pids = {"fnrt": procs[0].pid, "raw": procs[3].pid}
        deploy(fnrt, example)

        x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
        bodies = {
            "json": ("application/json", json.dumps({"x": x.tolist()}).encode()),
            "msgpack": (
                "application/msgpack",
                msgpack.packb({"x": x}, default=msgpack_numpy.encode),
            ),
        }
        scripts = {
            fmt: write_script(work, fmt, ctype, body) for fmt, (ctype, body) in bodies.items()
        }
        urls = {
            "fnrt": f"{fnrt}/v1/functions/mlp/invoke",
            "bare": bare,
            "lean": lean,
            "raw": raw,
        }
        for url in urls.values():  # warm up all (the first invoke loads fnrt's instance)
            for fmt in bodies:
                wrk(url, scripts[fmt], args.connections, 1)

        results: dict[tuple[str, str], list[Result]] = {}
        for _ in range(args.rounds):
            for fmt in bodies:
                for name, url in urls.items():
                    results.setdefault((name, fmt), []).append(
                        wrk(url, scripts[fmt], args.connections, args.duration_s)
                    )

        print(
            f"\nmlp example, {args.connections} connections, "
            f"{args.duration_s}s x {args.rounds} rounds (median round)\n"
        )
        print(
            f"{'server':<6} {'format':<8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'non-2xx':>8}"
        )
        for fmt in bodies:
            for name in urls:
                r = median(results[(name, fmt)])
                print(
                    f"{name:<6} {fmt:<8} {r.rps:>9.0f} "
                    f"{r.p50_ms:>8.2f} {r.p99_ms:>8.2f} {r.errors:>8}"
                )
        print()
        for name, base in (("fnrt", "bare"), ("fnrt", "lean"), ("fnrt", "raw"), ("lean", "raw")):
            for fmt in bodies:
                ratio = median(results[(name, fmt)]).rps / median(results[(base, fmt)]).rps
                spread = [
                    round(a.rps / b.rps, 2)
                    for a, b in zip(results[(name, fmt)], results[(base, fmt)], strict=True)
                ]
                print(f"{name} / {base} requests/s ({fmt}): {ratio:.2f}x   per round: {spread}")
        if args.plot:
            plot(results, args.plot)
        if args.breakdown:
            floor = profile_under_load(
                pids["raw"], urls["raw"], scripts["json"], args.connections, args.duration_s, work
            )
            ours = profile_under_load(
                pids["fnrt"], urls["fnrt"], scripts["json"], args.connections, args.duration_s, work
            )
            if floor is not None and ours is not None:
                print_breakdown("raw ASGI (json)", floor)
                print_breakdown("fnrt mlp (json)", ours, floor.loop_cpu_us)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def plot(results: dict[tuple[str, str], list[Result]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fmts = sorted({f for _, f in results})
    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = ("raw", "lean", "fnrt", "bare")
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [statistics.median(r.rps for r in results[(name, f)]) for f in fmts]
        ax.bar([j + i * width for j in range(len(fmts))], values, width=width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(fmts))], fmts)
    ax.set_ylabel("requests/s")
    ax.set_title("mlp: raw floor, lean batcher, fnrt, bare Starlette")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
