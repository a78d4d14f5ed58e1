"""What mypyc-compiled hot modules save a request: compiled against pure, interleaved.

    python bench/compiled.py [--pairs 6] [--rounds 3] [--requests 2048]
                             [--variants off,msgpack] [--only PATHS] [--instructions]

Copies this checkout's packages twice into a temporary folder, compiles the
request path's hot modules (``HOT``, or ``--only``'s comma-separated source
paths) in one copy with mypyc (extensions beside their sources, one shared
library; needs mypy, from ``[dev]``, and a C compiler), and runs
``bench/hotpath.py`` (fnrt's own Python between ASGI ``receive`` and
``send``, ``examples/mlp`` in a worker process, 32 callers, the request log
on) in a process of its own per run, alternately on each copy first on
``PYTHONPATH``, in the order pure, compiled, compiled, pure, ... so drift of a
shared machine falls on both alike. Each run gives the event loop thread's CPU
per request (``time.thread_time``, the median of its ``--rounds``); printed: every
run's figure and the ratio of the medians, compiled / pure, per variant. Thread
CPU, not wall clock: other processes on the machine slow both, not one.

``--instructions`` runs ``hotpath.py --instructions`` once each way instead:
the machine instructions a request costs the server's process, every thread of
it, under valgrind's callgrind (deterministic to about 2%, slow: minutes a run).
``--tests`` runs the compiled modules' unit tests on the compiled copy instead.

Nothing is compiled in the checkout itself: fnrt ships pure Python, since this
measured no gain (docs/benchmarks.md, "Compiled hot modules").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("client", "functions", "loader", "runtime", "tracing", "edge")

#: The modules compiled, by source path: the data-route template, input coercion,
#: the request record and queue, admission and the batch loop (the sequencer is an
#: Intake too: a compiled class's subclasses must be compiled).
HOT = (
    "functions/tensors.py",
    "runtime/queue.py",
    "runtime/intake.py",
    "runtime/batcher.py",
    "runtime/sequencer.py",
    "runtime/http/data.py",
)

#: The unit tests of the hot modules (--tests).
TESTS = (
    "tests/functions/test_tensors.py",
    "tests/runtime/test_queue.py",
    "tests/runtime/test_intake.py",
    "tests/runtime/test_batcher.py",
    "tests/runtime/test_sequencer.py",
    "tests/runtime/test_gateway.py",
    "tests/runtime/http/test_invoke.py",
)


def copy(work: Path, name: str) -> Path:
    """This checkout's packages under ``work/name/fnrt``; the ``PYTHONPATH`` entry."""
    top = work / name
    for folder in FOLDERS:
        shutil.copytree(
            ROOT / folder,
            top / "fnrt" / folder,
            ignore=shutil.ignore_patterns("*.so", "__pycache__"),
        )
    return top


def missing_tools() -> str | None:
    """Why nothing can be compiled here (None: it can)."""
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "mypyc is not installed (it comes with mypy: pip install mypy, in [dev])"
    program = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    try:
        subprocess.run([program, "--version"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return f"no working C compiler ({program})"
    return None


def compile_hot(top: Path, hot: tuple[str, ...], scratch: Path) -> None:
    """mypyc ``hot`` into extensions beside their sources in the copy at ``top``."""
    from mypyc.build import mypycify
    from setuptools import setup

    paths = [str(Path("fnrt", path)) for path in hot]
    options = ["--config-file", str(ROOT / "pyproject.toml"), "--explicit-package-bases"]
    with contextlib.chdir(top):
        extensions = mypycify(
            [*paths, *options], group_name="fnrt.runtime.compiled", target_dir=str(scratch / "c")
        )
        setup(
            name="fnrt-compiled",
            ext_modules=extensions,
            script_args=[
                *("--quiet", "build_ext", "--inplace"),
                *("--build-temp", str(scratch / "temp"), "--build-lib", str(scratch / "lib")),
            ],
        )
    built = sorted(str(p.relative_to(top)) for p in top.rglob("*.so"))
    print(f"compiled: {', '.join(built)}", flush=True)


def run(path: Path, args: list[str]) -> str:
    """``bench/hotpath.py`` with ``path`` first on ``PYTHONPATH``; its output."""
    env = os.environ | {"PYTHONPATH": str(path), "OMP_NUM_THREADS": "1"}
    check = "import fnrt.runtime.queue as q; print(q.__file__)"
    where = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    print(f"  (imports {where.removeprefix(str(path) + '/')})", flush=True)
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
    print(f"{'variant':<10} {'pure us/req':>12} {'compiled':>9} {'ratio':>7}", end="")
    print("   runs (pure | compiled)")
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


def tests(path: Path) -> None:
    """The hot modules' unit tests on the build first on ``PYTHONPATH``."""
    env = os.environ | {"PYTHONPATH": str(path)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS]
    print(f"PYTHONPATH={path} {' '.join(command)}", flush=True)
    subprocess.run(command, env=env, cwd=ROOT, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6, help="runs each way (timed)")
    parser.add_argument("--rounds", type=int, default=3, help="hotpath.py's rounds a run")
    parser.add_argument("--requests", type=int, default=2048, help="hotpath.py's requests")
    parser.add_argument("--variants", default="off,msgpack", help="hotpath.py's variants")
    parser.add_argument("--only", metavar="PATHS", help="compile these sources (comma-separated)")
    parser.add_argument("--instructions", action="store_true", help="count under callgrind")
    parser.add_argument("--tests", action="store_true", help="run the unit tests compiled")
    args = parser.parse_args()
    why = missing_tools()
    if why is not None:
        raise SystemExit(f"bench/compiled.py: nothing to compare: {why}")
    work = Path(tempfile.mkdtemp(prefix="fnrt-bench-compiled-"))
    try:
        paths = {"pure": copy(work, "pure"), "compiled": copy(work, "compiled")}
        hot = tuple(args.only.split(",")) if args.only else HOT
        compile_hot(paths["compiled"], hot, work / "scratch")
        if args.tests:
            tests(paths["compiled"])
        elif args.instructions:
            counted(paths, args)
        else:
            timed(paths, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
