"""Does another HTTP server pay? uvicorn against Granian, each beside its own floor (#42 item 6).

    python bench/stacks.py [--duration-s 5] [--rounds 3] [--connections 32]

#42 asks fnrt to serve at least 0.45x of the HTTP floor of the stack it ships,
and allows another server if it pays: Granian (Rust, on PyPI; ``pip install
granian``) answered a constant body faster than uvicorn. Here, one at a time
on the same 2-core machine, each alone under load (the others idle), JSON
invokes of ``examples/mlp`` with ``wrk -t1 -c32``:

- ``raw``: the constant answer (``raw_app.py``), the floor of each stack;
- ``lean``: the leanest batching server (``lean_app.py``: parse, queue, one
  task running batches inline, answer), the floor of the design;
- ``fnrt``: fnrt's own app, as ``fnrt serve`` builds it (worker processes,
  the request log on): on uvicorn through ``fnrt serve`` (its data routes
  answered at the connection), on Granian as an ASGI app
  (``granian_fnrt.py``), as fnrt would run there without a rewrite.

Granian runs at its defaults (one worker process, one runtime thread, uvloop
when installed), RSGI for the raw and lean apps (its own interface, the fast
one), ASGI for fnrt. Each app's ratio is against its own stack's floor in the
same round, and Granian's against uvicorn's of the same app.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from invoke import bodies, deploy, invoke_url
from loadgen import (
    BIN,
    Result,
    copy_mlp,
    free_port,
    median,
    median_cpu_us,
    require_wrk,
    start_fnrt,
    start_lean,
    start_raw,
    wait_ready,
    wrk,
)

HERE = Path(__file__).resolve().parent


def start_granian(
    target: str, interface: str, env: dict[str, str], log: Path, *, factory: bool = True
) -> tuple[str, subprocess.Popen[bytes]]:
    """``granian`` serving ``target`` (an app, or a factory making it) on a free port, at
    its defaults; its stderr (fnrt's request log) into ``log``."""
    if not (BIN / "granian").exists():
        raise SystemExit("bench/stacks.py needs Granian: pip install granian")
    port = free_port()
    argv = [str(BIN / "granian"), "--interface", interface, "--port", str(port)]
    argv += ["--no-log", *(["--factory"] if factory else []), target]
    environ = env | {"PYTHONPATH": os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])}
    with log.open("wb") as stderr:
        proc = subprocess.Popen(argv, env=environ, cwd=HERE, stderr=stderr)
    wait_ready(f"http://127.0.0.1:{port}/", proc)
    return f"http://127.0.0.1:{port}", proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration-s", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    require_wrk()

    work = Path(tempfile.mkdtemp(prefix="fnrt-bench-stacks-"))
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        example, weights = copy_mlp(work)
        urls: dict[str, str] = {}
        pids: dict[str, int] = {}

        def started(name: str, url: str, proc: subprocess.Popen[bytes]) -> None:
            procs.append(proc)
            urls[name], pids[name] = url, proc.pid

        url, proc = start_raw(env)
        started("raw/uvicorn", url, proc)
        url, proc = start_granian("raw_app:rsgi", "rsgi", env, work / "raw.log", factory=False)
        started("raw/granian", f"{url}/invoke", proc)
        url, proc = start_lean(example, weights, env)
        started("lean/uvicorn", url, proc)
        lean_env = env | {"LEAN_EXAMPLE": str(example), "LEAN_WEIGHTS": str(weights)}
        url, proc = start_granian("lean_app:rsgi", "rsgi", lean_env, work / "lean.log")
        started("lean/granian", f"{url}/invoke", proc)
        folder = work / "uvicorn"
        folder.mkdir()
        url, proc = start_fnrt(str(folder / "store"), folder / "cache", env)
        deploy(url, example, env)
        started("fnrt/uvicorn", invoke_url("fnrt", url), proc)
        folder = work / "granian"
        folder.mkdir()
        fnrt_env = env | {
            "FNRT_STORE": str(folder / "store"),
            "FNRT_CACHE_DIR": str(folder / "cache"),
        }
        url, proc = start_granian("granian_fnrt:app", "asgi", fnrt_env, work / "fnrt.log")
        deploy(url, example, env)
        started("fnrt/granian", invoke_url("fnrt", url), proc)

        script = bodies(work)["json"]
        for url in urls.values():  # warm up all (fnrt's first invoke loads the model)
            wrk(url, script, args.connections, 1)
        results: dict[str, list[Result]] = {name: [] for name in urls}
        names = list(urls)
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                results[name].append(
                    wrk(urls[name], script, args.connections, args.duration_s, pids[name])
                )
        report(results, args)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def report(results: dict[str, list[Result]], args: argparse.Namespace) -> None:
    print(
        f"\nmlp example, JSON, {args.connections} connections, "
        f"{args.duration_s}s x {args.rounds} rounds (median round)\n"
    )
    print(
        f"{'app/stack':<14} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/req':>11} "
        f"{'non-2xx':>8} {'/ its floor':>12} {'granian/uvicorn':>16}"
    )
    for name, rounds in results.items():
        app, stack = name.split("/")
        r = median(rounds)
        floor = [x.rps / f.rps for x, f in zip(rounds, results[f"raw/{stack}"], strict=True)]
        other = [
            g.rps / u.rps
            for g, u in zip(results[f"{app}/granian"], results[f"{app}/uvicorn"], strict=True)
        ]
        against = "" if stack == "uvicorn" else f"{sorted(other)[len(other) // 2]:.2f}x"
        print(
            f"{name:<14} {r.rps:>9.0f} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f} "
            f"{median_cpu_us(rounds):>11.1f} {r.errors:>8} "
            f"{sorted(floor)[len(floor) // 2]:>11.2f}x {against:>16}"
        )
    print("\nper round, each app against its own stack's floor:")
    for name, rounds in results.items():
        stack = name.split("/")[1]
        per = [x.rps / f.rps for x, f in zip(rounds, results[f"raw/{stack}"], strict=True)]
        print(f"  {name:<14} " + ", ".join(f"{v:.2f}" for v in per))


if __name__ == "__main__":
    sys.exit(main())
