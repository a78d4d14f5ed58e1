"""fnrt serving the ``mlp`` example against the HTTP floor, a bare Starlette endpoint and
the leanest batching server: every figure #42's "done when" names, in one run.

    python bench/invoke.py [--connections 32] [--duration-s 8] [--rounds 3]
                           [--burst-s 10] [--baseline REV | --baseline none]
                           [--plot FILE.png] [--no-breakdown]

All run on uvicorn with uvloop and httptools, one process each, with
``OMP_NUM_THREADS=1``, driven by ``wrk`` (Debian package ``wrk``) with the same
body at the same concurrency, in ``--rounds`` interleaved rounds (drift hits all
alike; each round starts with another server; the median round is reported,
with each round's ratios):

- ``raw``: a raw ASGI app that reads the body and answers a constant one
  (``raw_app.py``): the floor the stack allows, no model (#42's floor);
- ``rawconn``: the same constant answered at the connection, without ASGI
  (``raw_app.py --connection``): the floor of the way fnrt now answers its
  data routes (the connection starts the route; no ASGI dispatch);
- ``bare``: a bare Starlette endpoint calling the same model inline (``bare_app.py``);
- ``lean``: the leanest batching server (``lean_app.py``: body, parse, array, a
  future, batches run inline on the loop, nothing else): the floor of the design;
- ``fnrt``: ``fnrt serve`` with default settings (worker processes, the request
  log on, tracing off);
- ``thread``: the same with ``--isolation thread``;
- ``traced``: the same as ``fnrt`` with every request traced (``--trace-sample
  1.0``, OTLP to a local collector that drops what it gets);
- ``base``: ``fnrt`` at ``--baseline`` (default: 63528cf, the commit before #42's
  redesign), its packages first on ``PYTHONPATH`` from a ``git archive`` of it in the
  bench's temporary folder (the checkout is not touched).

Each in JSON and msgpack at ``--connections``, then at one connection (JSON: a
lone request's p50), then a burst right after a deploy: a new function (a copy
of ``mlp`` under another name) deployed to ``fnrt`` and loaded at once with
``--connections`` for ``--burst-s`` seconds, against the same server's warm
figure. Beside each row: the server's CPU per request (every process of it,
its workers included). Then (unless ``--no-breakdown``) py-spy samples the event
loop thread of ``raw``, ``fnrt`` and ``base`` through one more JSON run each, and
prints where a request's time goes there, part by part, in microseconds a
request (``breakdown.py``; py-spy from the package index): the breakdown before
and after. The ratios the issue asks for close the output.

Wall-clock figures need a quiet machine; on a shared one, read the ratios within
a round, and ``bench/hotpath.py --bytecodes`` for deterministic counts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import msgpack
import msgpack_numpy
import numpy as np
from breakdown import Breakdown, print_breakdown, profile_under_load
from loadgen import (
    Result,
    copy_mlp,
    median,
    require_wrk,
    start_bare,
    start_fnrt,
    start_lean,
    start_raw,
    write_script,
    wrk,
)

from tracing import SINK

ROOT = Path(__file__).resolve().parent.parent
#: The commit before #42's redesign of the request path: the "before" of the breakdown.
BASELINE = "63528cf"
#: fnrt's packages, put first on PYTHONPATH to serve an older commit.
FOLDERS = ("client", "functions", "loader", "runtime", "tracing", "edge")
FORMATS = ("json", "msgpack")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration-s", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--burst-s", type=int, default=10, help="the burst after a deploy")
    parser.add_argument(
        "--baseline",
        default=BASELINE,
        help=f"the commit to serve as 'base' (default {BASELINE}); 'none' for no base",
    )
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
    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout is not None
        collector = f"http://127.0.0.1:{sink.stdout.readline().strip()}"
        example, weights = copy_mlp(work)
        servers: dict[str, str] = {}
        pids: dict[str, int] = {}

        def fnrt(name: str, *extra: str, environ: dict[str, str] | None = None) -> None:
            folder = work / name
            folder.mkdir()
            url, proc = start_fnrt(str(folder / "store"), folder / "cache", environ or env, *extra)
            procs.append(proc)
            deploy(url, example, environ or env)  # the server's own fnrt packs it
            servers[name], pids[name] = url, proc.pid

        fnrt("fnrt")
        fnrt("thread", "--isolation", "thread")
        traced = ("--trace", "otlp", "--trace-endpoint", collector, "--trace-sample", "1.0")
        fnrt("traced", *traced)
        if args.baseline != "none":
            try:
                overlay = checkout(args.baseline, work)
            except subprocess.CalledProcessError as exc:  # a shallow clone, say
                print(f"no baseline: git archive {args.baseline} failed: {exc.stderr!r}")
            else:
                fnrt("base", environ=env | {"PYTHONPATH": str(overlay)})
        for name, start in (("bare", start_bare), ("lean", start_lean)):
            url, proc = start(example, weights, env)
            procs.append(proc)
            servers[name], pids[name] = url, proc.pid
        for name, extra in (("raw", ()), ("rawconn", ("--connection",))):
            url, proc = start_raw(env, *extra)
            procs.append(proc)
            servers[name], pids[name] = url, proc.pid

        scripts = bodies(work)
        urls = {name: invoke_url(name, url) for name, url in servers.items()}
        for url in urls.values():  # warm up all (the first invoke loads fnrt's instance)
            for fmt in FORMATS:
                wrk(url, scripts[fmt], args.connections, 1)

        results: dict[tuple[str, str], list[Result]] = {}
        lone: dict[str, list[Result]] = {}
        bursts: list[Result] = []
        names = list(urls)
        for round_ in range(args.rounds):
            # each round starts with another server: the first measured after a pause
            # (the warm-up, the last round's burst) ran 0.64-0.94x its own figure when
            # measured later, whichever it was
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for fmt in FORMATS:
                for name in order:
                    results.setdefault((name, fmt), []).append(
                        wrk(urls[name], scripts[fmt], args.connections, args.duration_s, pids[name])
                    )
            for name, url in urls.items():
                lone.setdefault(name, []).append(
                    wrk(url, scripts["json"], 1, args.duration_s, pids[name])
                )
            bursts.append(
                burst_after_deploy(
                    servers["fnrt"], example, work, round_, args.connections, args.burst_s
                )
            )

        print(
            f"\nmlp example, {args.connections} connections, "
            f"{args.duration_s}s x {args.rounds} rounds (median round)\n"
        )
        print(
            f"{'server':<7} {'format':<8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'CPU us/req':>11} {'non-2xx':>8}"
        )
        for fmt in FORMATS:
            for name in urls:
                row(name, fmt, median(results[(name, fmt)]))
        print(f"\none connection (JSON), {args.duration_s}s x {args.rounds} rounds\n")
        for name in urls:
            row(name, "json", median(lone[name]))
        warm = median(results[("fnrt", "json")])
        burst = median(bursts)
        print(
            f"\nthe first {args.burst_s} s after a deploy, {args.connections} connections (JSON)\n"
        )
        row("burst", "json", burst)
        print()
        ratios(results, lone, bursts, warm, burst)
        if args.plot:
            plot(results, args.plot)
        if args.breakdown:
            breakdowns(urls, pids, scripts["json"], args.connections, args.duration_s, work)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        sink.terminate()
        sink.wait()
        shutil.rmtree(work, ignore_errors=True)


def checkout(rev: str, work: Path) -> Path:
    """``rev``'s fnrt packages, unpacked in ``work`` (``git archive``: the checkout and
    its index are not touched); the folder to put first on ``PYTHONPATH``."""
    tree = work / "baseline-tree"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, *FOLDERS], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    overlay = work / "baseline-overlay"
    (overlay / "fnrt").mkdir(parents=True)
    for folder in FOLDERS:
        (overlay / "fnrt" / folder).symlink_to(tree / folder)
    return overlay


def invoke_url(name: str, url: str, function: str = "mlp") -> str:
    return (
        url
        if name in ("bare", "lean", "raw", "rawconn")
        else f"{url}/v1/functions/{function}/invoke"
    )


def bodies(work: Path) -> dict[str, Path]:
    """wrk scripts posting the same (1, 64) float32 input as JSON and as msgpack."""
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    payloads = {
        "json": ("application/json", json.dumps({"x": x.tolist()}).encode()),
        "msgpack": ("application/msgpack", msgpack.packb({"x": x}, default=msgpack_numpy.encode)),
    }
    return {fmt: write_script(work, fmt, ctype, body) for fmt, (ctype, body) in payloads.items()}


def burst_after_deploy(
    server: str, example: Path, work: Path, index: int, connections: int, seconds: int
) -> Result:
    """``connections`` callers for ``seconds`` on a function deployed just before (a copy
    of the example under a new name: its first calls wait for its first load)."""
    name = f"mlp-burst-{index}"
    deploy(server, example, os.environ, "--name", name)
    return wrk(invoke_url("fnrt", server, name), work / "json.lua", connections, seconds)


def deploy(server: str, folder: Path, env: Mapping[str, str], *extra: str) -> None:
    """``fnrt deploy`` with ``env`` (a baseline's packages first: its own manifest format)."""
    argv = [str(Path(sys.executable).parent / "fnrt"), "deploy", str(folder), "--server", server]
    subprocess.run([*argv, "-q", *extra], check=True, capture_output=True, env=dict(env))


def row(name: str, fmt: str, r: Result) -> None:
    cpu = f"{r.cpu_us:>11.1f}" if r.cpu_us is not None else f"{'':>11}"
    print(f"{name:<7} {fmt:<8} {r.rps:>9.0f} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f} {cpu} {r.errors:>8}")


def ratios(
    results: dict[tuple[str, str], list[Result]],
    lone: dict[str, list[Result]],
    bursts: list[Result],
    warm: Result,
    burst: Result,
) -> None:
    """The comparisons #42's "done when" asks for, median and per round."""
    names = {name for name, _ in results}

    def compare(label: str, a: list[Result], b: list[Result]) -> None:
        ratio = median(a).rps / median(b).rps
        spread = [round(x.rps / y.rps, 2) for x, y in zip(a, b, strict=True)]
        print(f"{label:<44} {ratio:>5.2f}x   per round: {spread}")

    pairs = [("fnrt", "raw"), ("thread", "raw"), ("fnrt", "rawconn"), ("raw", "rawconn")]
    pairs += [("fnrt", "bare"), ("fnrt", "lean")]
    pairs += [("lean", "raw"), ("fnrt", "thread"), ("traced", "fnrt"), ("fnrt", "base")]
    for a, b in pairs:
        if a in names and b in names:
            for fmt in FORMATS:
                compare(f"{a} / {b} requests/s ({fmt})", results[(a, fmt)], results[(b, fmt)])
    for name in ("fnrt", "thread"):
        compare(
            f"{name}: msgpack / JSON requests/s",
            results[(name, "msgpack")],
            results[(name, "json")],
        )
    for fmt in FORMATS:
        ours, bare = median(results[("fnrt", fmt)]), median(results[("bare", fmt)])
        print(f"{'fnrt p99 - bare p99 (' + fmt + ')':<44} {ours.p99_ms - bare.p99_ms:>+6.2f} ms")
    p50 = median(lone["fnrt"]).p50_ms - median(lone["bare"]).p50_ms
    print(f"{'one connection: fnrt p50 - bare p50':<44} {p50:>+6.2f} ms")
    print(
        f"{'burst after a deploy / warm requests/s':<44} {burst.rps / warm.rps:>5.2f}x   "
        f"per round: {[round(b.rps / warm.rps, 2) for b in bursts]}; "
        f"p99 {burst.p99_ms:.2f} ms against warm {warm.p99_ms:.2f} ms"
    )


def breakdowns(
    urls: dict[str, str],
    pids: dict[str, int],
    script: Path,
    connections: int,
    duration_s: int,
    work: Path,
) -> None:
    """Where a JSON request's time goes on the event loop's thread: the floor, fnrt
    now, and fnrt at the baseline (before)."""
    found: dict[str, Breakdown] = {}
    for name in ("raw", "base", "fnrt"):
        if name in urls:
            sampled = profile_under_load(
                pids[name], urls[name], script, connections, duration_s, work
            )
            if sampled is not None:
                found[name] = sampled
    floor = found.get("raw")
    for name, title in (
        ("raw", "raw ASGI"),
        ("base", "fnrt before (baseline)"),
        ("fnrt", "fnrt now"),
    ):
        if name in found:
            print_breakdown(f"{title} (json)", found[name], floor.loop_cpu_us if floor else None)
    if "base" in found and "fnrt" in found:
        before, after = found["base"].loop_cpu_us, found["fnrt"].loop_cpu_us
        print(f"\nevent-loop CPU a request: before {before:.1f} us, now {after:.1f} us")


def plot(results: dict[tuple[str, str], list[Result]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({n for n, _ in results})
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [statistics.median(r.rps for r in results[(name, f)]) for f in FORMATS]
        ax.bar([j + i * width for j in range(len(FORMATS))], values, width=width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(FORMATS))], FORMATS)
    ax.set_ylabel("requests/s")
    ax.set_title("mlp: the floor, bare Starlette, the lean batcher, fnrt")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
