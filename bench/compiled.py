"""What the mypyc-compiled hot modules save a request: compiled against pure, interleaved.

    python mypyc_build.py                  # compile them first (make compiled)
    python bench/compiled.py [--pairs 6] [--rounds 3] [--requests 2048]
                             [--variants off,msgpack] [--instructions]

Runs ``bench/hotpath.py`` (fnrt's own Python between ASGI ``receive`` and
``send``, ``examples/mlp`` in a worker process, 32 callers, the request log
on) in a process of its own per run, alternately on this checkout's packages
as they are (the compiled extensions beside their sources) and on a copy of
the same sources without the extensions (pure Python), each first on
``PYTHONPATH``, in the order pure, compiled, compiled, pure, ... so drift of a
shared machine falls on both alike. Each run gives the event loop thread's CPU
per request (``time.thread_time``, the median of its ``--rounds``); printed: every
run's figure and the ratio of the medians, compiled / pure, per variant. Thread
CPU, not wall clock: other processes on the machine slow both, not one.

``--instructions`` runs ``hotpath.py --instructions`` once each way instead:
the machine instructions a request costs the server's process, every thread of
it, under valgrind's callgrind (deterministic to about 2%, slow: minutes a run).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("client", "functions", "loader", "runtime", "tracing", "edge")
sys.path.insert(0, str(ROOT))

from mypyc_build import compiled_files  # noqa: E402


def overlays(work: Path) -> dict[str, Path]:
    """A ``PYTHONPATH`` entry per build: this checkout as it is, and its sources alone."""
    compiled = work / "compiled" / "fnrt"
    pure = work / "pure" / "fnrt"
    compiled.mkdir(parents=True)
    pure.mkdir(parents=True)
    for folder in FOLDERS:
        (compiled / folder).symlink_to(ROOT / folder)
        shutil.copytree(
            ROOT / folder, pure / folder, ignore=shutil.ignore_patterns("*.so", "__pycache__")
        )
    return {"pure": pure.parent, "compiled": compiled.parent}


def run(path: Path, args: list[str]) -> str:
    """``bench/hotpath.py`` with ``path`` first on ``PYTHONPATH``; its output."""
    env = os.environ | {"PYTHONPATH": str(path), "OMP_NUM_THREADS": "1"}
    check = "import fnrt.runtime.queue as q; print(q.__file__)"
    where = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    print(f"  ({where.removeprefix(str(path) + '/')})", flush=True)
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "hotpath.py"), *args],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"hotpath.py failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def timed(paths: dict[str, Path], args: argparse.Namespace) -> None:
    names = args.variants.split(",")
    options = ["--variants", args.variants, "--rounds", str(args.rounds)]
    options += ["--requests", str(args.requests)]
    cpu: dict[str, dict[str, list[float]]] = {b: {n: [] for n in names} for b in paths}
    order = ["pure", "compiled", "compiled", "pure"]
    for index in range(2 * args.pairs):
        build = order[index % 4]
        print(f"run {index + 1} of {2 * args.pairs}: {build}", flush=True)
        out = run(paths[build], options)
        for name in names:
            found = re.search(rf"^{re.escape(name)}\s+([\d.]+)\s", out, re.MULTILINE)
            if found is None:
                raise SystemExit(f"no figure for {name} in:\n{out}")
            cpu[build][name].append(float(found.group(1)))
    print(
        f"\nexamples/mlp, hotpath.py --variants {args.variants} --rounds {args.rounds} "
        f"--requests {args.requests}, {args.pairs} runs each way, interleaved\n"
    )
    print(f"{'variant':<10} {'pure us/req':>12} {'compiled':>9} {'ratio':>7}   runs (pure | compiled)")
    for name in names:
        pure, compiled = cpu["pure"][name], cpu["compiled"][name]
        ratio = statistics.median(compiled) / statistics.median(pure)
        runs = " ".join(f"{v:.0f}" for v in pure) + " | " + " ".join(f"{v:.0f}" for v in compiled)
        print(
            f"{name:<10} {statistics.median(pure):>12.1f} {statistics.median(compiled):>9.1f}"
            f" {ratio:>6.3f}x   {runs}"
        )


def counted(paths: dict[str, Path], args: argparse.Namespace) -> None:
    options = ["--instructions", "--variants", args.variants, "--requests", str(args.requests)]
    totals: dict[str, dict[str, float]] = {}
    for build in ("pure", "compiled"):
        print(f"{build}: hotpath.py {' '.join(options)}", flush=True)
        out = run(paths[build], options)
        print(out)
        totals[build] = {
            m.group(1): float(m.group(2).replace(",", ""))
            for m in re.finditer(r"^(\S+): ([\d,]+) instructions a request", out, re.MULTILINE)
        }
    print(f"\n{'variant':<10} {'pure instr/req':>15} {'compiled':>12} {'ratio':>7}")
    for name, pure in totals["pure"].items():
        compiled = totals["compiled"][name]
        print(f"{name:<10} {pure:>15,.0f} {compiled:>12,.0f} {compiled / pure:>6.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6, help="runs each way (timed)")
    parser.add_argument("--rounds", type=int, default=3, help="hotpath.py's rounds a run")
    parser.add_argument("--requests", type=int, default=2048, help="hotpath.py's requests")
    parser.add_argument("--variants", default="off,msgpack", help="hotpath.py's variants")
    parser.add_argument("--instructions", action="store_true", help="count under callgrind")
    args = parser.parse_args()
    if not compiled_files():
        raise SystemExit("nothing is compiled: run python mypyc_build.py (make compiled) first")
    work = Path(tempfile.mkdtemp(prefix="fnrt-bench-compiled-"))
    try:
        paths = overlays(work)
        if args.instructions:
            counted(paths, args)
        else:
            timed(paths, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
