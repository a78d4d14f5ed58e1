"""What fnrt's own code costs the event loop per request, without sockets or HTTP parsing.

    python bench/hotpath.py [--variants off,100%,msgpack,100%msgpack,raw] [--rounds 8]
                            [--requests 2048] [--profile VARIANT] [--top 30]
                            [--instructions | --bytecodes]

Each variant is an fnrt app (``build_app``, as ``fnrt serve`` builds it, the
request log on) serving ``examples/mlp`` in a worker process, driven in this
process on uvloop by 32 concurrent callers (``--callers``: 1 is a lone
request, a batch of its own each time) through its ASGI interface: no
socket, no HTTP parser, so what is measured is fnrt's Python between
uvicorn's ``receive`` and ``send``, the part fnrt can change. Variants:

- ``off``: JSON invokes, tracing off (the baseline);
- ``100%``: the same with every request traced, exported as OTLP to a
  collector on 127.0.0.1 that drops what it gets;
- ``msgpack``: msgpack invokes, tracing off;
- ``100%msgpack``: msgpack invokes, every request traced;
- ``raw``: ``raw_app.py``'s constant answer: what this driver itself costs.

The node's sweeps (keep-alive, pre-warming, the store's change feed) are
timers, not a request's work, so they are off here.

The figure is the event loop's thread CPU per request (``time.thread_time``),
the median of ``--rounds`` interleaved rounds, and its ratio to ``off``'s in
the same run; beside it, the time the garbage collector took per request.
Thread CPU is steadier than requests/s on a shared machine, but still drifts
between rounds (by 20% on a busy day): read the ratios, over many rounds.
``--profile VARIANT`` runs one more round of it under cProfile and lists the
functions with the most time of their own, in microseconds a request
(cProfile's own cost inflates each call by a fraction of a microsecond:
compare variants, not absolutes).

``--instructions`` counts instead of timing, for a machine too noisy to time
a change of a few percent: each variant runs in a process of its own under
valgrind's callgrind (Debian package ``valgrind``), once with a few requests
and once with ``--requests`` more, and the difference of the two counts over
``--requests`` is what one request costs the server's process, every thread
of it (the worker process and the span shipper are not counted), in machine
instructions: within about 2% from run to run whatever else the machine is
doing (batch sizes and the background threads' wake-ups still follow the
clock), where timed rounds here drift by 20%. Beside the totals, where the
instructions ran, by library (``callgrind_annotate``): the interpreter (fnrt's
Python and every library's), the garbage collector, numpy, orjson, libc and
the rest. Instructions are not time (a cache miss costs more than an add):
confirm a gain this shows with the timed runs. A run takes a few minutes
(Python runs some 50 times slower under valgrind); to compare two commits,
run both at once, one with the other's packages first on ``PYTHONPATH`` (as
``ab.py`` does), so both see the same load.

``--bytecodes`` counts the Python bytecodes a request runs on the event loop's
thread (``sys.settrace`` with opcode events, over ``--requests`` requests after
the warm-up), exactly and in a few seconds, for each variant, and the Python calls
(frames entered, a coroutine's resumptions among them), then the ``--top``
functions by their bytecodes a request with a column per variant: where the
Python of the path is, and what a variant adds (a dataclass's generated
``__init__`` is named by its class). A bytecode is not a fixed time either
(a call costs more than a load): it is the count to cut, and the timed runs
say what a cut was worth.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import gc
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import msgpack_numpy
import numpy as np
import orjson
import raw_app
import uvloop
from loadgen import ROOT, copy_mlp

from fnrt.functions.bundle import pack
from fnrt.functions.manifest import load_manifest
from fnrt.functions.version import VersionManifest
from fnrt.runtime.http.app import build_app
from fnrt.runtime.settings import ServerSettings
from fnrt.tracing.config import TraceConfig
from tracing import start_sink

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
CONCURRENCY = 32
#: The callers the driver runs (``--callers``; one: every request a batch of its own,
#: what a lone request costs, batch work included).
CALLERS = [CONCURRENCY]
PATH = "/v1/functions/mlp/invoke"


class GcClock:
    """Time the garbage collector takes, through ``gc.callbacks``."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


def request(body: bytes, media_type: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """The scope of one invoke and the message ``receive`` answers with."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": PATH,
        "raw_path": PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"user-agent", b"hotpath"),
            (b"content-type", media_type),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    return scope, {"type": "http.request", "body": body, "more_body": False}


async def invoke(app: App, scope: dict[str, Any], message: dict[str, Any]) -> int:
    """One request through ``app``; the status it answered."""
    status = 0
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if received:  # the server waits for a disconnect that never comes
            await asyncio.Event().wait()
        received = True
        return message

    async def send(sent: dict[str, Any]) -> None:
        nonlocal status
        if sent["type"] == "http.response.start":
            status = sent["status"]

    await app(dict(scope), receive, send)
    return status


async def drive(app: App, scope: dict[str, Any], message: dict[str, Any], count: int) -> None:
    """``count`` requests by ``CALLERS[0]`` callers (``--callers``), each waiting for its
    answer."""

    async def caller(calls: int) -> None:
        for _ in range(calls):
            status = await invoke(app, scope, message)
            if status != 200:
                raise SystemExit(f"an invoke answered {status}")

    callers = CALLERS[0]
    await asyncio.gather(*(caller(count // callers) for _ in range(callers)))


def media(variant: str) -> str:
    """The body a variant sends: msgpack for ``msgpack`` and ``100%msgpack``, else JSON."""
    return "msgpack" if variant.endswith("msgpack") else "json"


def bodies() -> dict[str, tuple[bytes, bytes]]:
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    return {
        "json": (orjson.dumps({"x": x.tolist()}), b"application/json"),
        "msgpack": (msgpack.packb({"x": x}, default=msgpack_numpy.encode), b"application/msgpack"),
    }


async def start(
    name: str, work: Path, example: Path, collector: str, stack: contextlib.AsyncExitStack
) -> App:
    """The app of variant ``name``, started, with ``example`` deployed and loaded."""
    if name == "raw":
        return raw_app.app
    trace = (
        TraceConfig(exporter="otlp", endpoint=collector, sampler="always_on")
        if name.startswith("100%")
        else TraceConfig()
    )
    settings = ServerSettings(
        store=str(work / f"store-{name}"),
        cache_dir=work / f"cache-{name}",
        request_log_file=work / f"requests-{name}.log",  # on, as in production
        trace=trace,
        sweep_interval_s=3600,  # timers are not a request's work (and would skew counts)
    )
    app = build_app(settings)
    await stack.enter_async_context(app.router.lifespan_context(app))
    await deploy_example(app.state.node, example)
    return app  # type: ignore[no-any-return]


async def deploy_example(node: Any, example: Path) -> None:
    """Deploy the function in folder ``example`` to ``node`` (its files put in the store)."""
    manifest = load_manifest(example)
    bundle = pack(example, manifest)
    for ref, source in bundle.blob_sources():
        node.repository.put_blob(ref.digest, source)
    await node.deployer.deploy(VersionManifest(manifest, bundle.code_ref, bundle.artifacts))


async def measure(args: argparse.Namespace, work: Path, example: Path, collector: str) -> None:
    payloads = bodies()
    names = args.variants.split(",")
    clock = GcClock()
    async with contextlib.AsyncExitStack() as stack:
        apps, requests = {}, {}
        for name in names:
            apps[name] = await start(name, work, example, collector, stack)
            requests[name] = request(*payloads[media(name)])
            await drive(apps[name], *requests[name], WARM)  # loads the model
        cpu: dict[str, list[float]] = {name: [] for name in names}
        gc_us: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(args.rounds):  # each round starts with another variant
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                before, gc_before = time.thread_time(), clock.seconds
                await drive(apps[name], *requests[name], args.requests)
                cpu[name].append((time.thread_time() - before) / args.requests * 1e6)
                gc_us[name].append((clock.seconds - gc_before) / args.requests * 1e6)
        report(names, cpu, gc_us, args)
        if args.profile:
            profile = cProfile.Profile()
            profile.enable()
            await drive(apps[args.profile], *requests[args.profile], args.requests)
            profile.disable()
            print_profile(args.profile, profile, args.requests, args.top)


def report(
    names: list[str], cpu: dict[str, list[float]], gc_us: dict[str, list[float]], args: Any
) -> None:
    print(
        f"\nexamples/mlp, {CALLERS[0]} concurrent callers in process, "
        f"{args.requests} requests x {args.rounds} rounds (median round)\n"
    )
    print(f"{'variant':<10} {'loop CPU us/req':>16} {'ratio':>7} {'GC us/req':>10}   rounds")
    base = statistics.median(cpu[names[0]])
    for name in names:
        median = statistics.median(cpu[name])
        rounds = ", ".join(f"{v:.0f}" for v in cpu[name])
        print(
            f"{name:<10} {median:>16.1f} {median / base:>6.2f}x "
            f"{statistics.median(gc_us[name]):>10.1f}   [{rounds}]"
        )


def print_profile(name: str, profile: cProfile.Profile, requests: int, top: int) -> None:
    stats = pstats.Stats(profile)
    rows = []
    for (path, line, function), (_, calls, own_s, _, _) in stats.stats.items():  # type: ignore[attr-defined,unused-ignore]
        where = path.split("site-packages/")[-1].split("/fnrt/")[-1]
        rows.append((own_s / requests * 1e6, calls / requests, f"{function} ({where}:{line})"))
    rows.sort(reverse=True)
    print(f"\n{name}: the {top} functions with the most time of their own (cProfile)\n")
    print(f"{'us/req':>7} {'calls/req':>9}  function")
    for own_us, calls, where in rows[:top]:
        print(f"{own_us:>7.2f} {calls:>9.2f}  {where}")
    print(f"{sum(r[0] for r in rows):>7.2f} {sum(r[1] for r in rows):>9.2f}  all")


async def run_one(name: str, count: int, work: Path, example: Path, collector: str) -> None:
    """Variant ``name`` alone: start, warm, then ``count`` requests (``--one``, which
    ``--instructions`` runs under valgrind)."""
    async with contextlib.AsyncExitStack() as stack:
        app = await start(name, work, example, collector, stack)
        scope, message = request(*bodies()[media(name)])
        await drive(app, scope, message, WARM)
        if count:
            await drive(app, scope, message, count)


#: Requests that load the model before anything is measured; ``--instructions``'s
#: short run makes no more.
WARM = 64


@dataclass(frozen=True)
class Counted:
    """What one request of a variant costs under callgrind: machine instructions in all,
    and by where they ran (:func:`part_of`)."""

    total: float
    parts: dict[str, float]


def part_of(function: str) -> str:
    """Where a function callgrind names belongs: the garbage collector, the rest of the
    interpreter (fnrt's Python and every library's), or the native library it is in."""
    if "gcmodule.c" in function:
        return "the garbage collector"
    library = re.search(r"\[([^\]]*)\]\s*$", function)
    path = library.group(1) if library else ""
    name = Path(path).name
    if not name or name.startswith("libpython"):  # no library: inlined from its headers
        return "the interpreter (Python code)"
    for fragment, part in (
        ("numpy", "numpy"),
        ("orjson", "orjson"),
        ("msgpack", "msgpack"),
        ("uvloop", "uvloop"),
        ("torch", "torch"),
        ("libc.so", "libc: malloc, memcpy, system calls"),
    ):
        if fragment in path:
            return part
    return name.split(".")[0]


def by_part(out: Path) -> dict[str, int]:
    """Instructions by :func:`part_of` in a callgrind output file."""
    listing = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", str(out)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    parts: dict[str, int] = {}
    for line in listing.splitlines():
        found = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)", line)
        if found is None or "PROGRAM TOTALS" in line:
            continue
        part = part_of(found.group(2))
        parts[part] = parts.get(part, 0) + int(found.group(1).replace(",", ""))
    return parts


def instructions(name: str, requests: int, example: Path, collector: str, work: Path) -> Counted:
    """What one request of variant ``name`` costs its server's process: two runs under
    callgrind, one ``requests`` longer, at once; the difference over ``requests``."""
    env = os.environ | {"PYTHONHASHSEED": "0"}  # the same dict and set orders in both

    def run(count: int) -> tuple[subprocess.Popen[str], Path]:
        out = work / f"callgrind-{name.replace('%', 'pct')}-{count}.out"  # (valgrind reads %)
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        argv += [sys.executable, __file__, "--one", name, "--requests", str(count)]
        argv += ["--example", str(example), "--collector", collector]
        argv += ["--callers", str(CALLERS[0])]
        return subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True), out

    runs = [run(0), run(requests)]
    totals, parts = [], []
    for process, out in runs:
        _, err = process.communicate()
        found = re.search(r"Collected : (\d+)", err)
        if process.returncode != 0 or found is None:
            raise SystemExit(f"valgrind failed on {name}: {err[-500:]}")
        totals.append(int(found.group(1)))
        parts.append(by_part(out))
    short, long = parts
    return Counted(
        (totals[1] - totals[0]) / requests,
        {part: (long.get(part, 0) - short.get(part, 0)) / requests for part in long},
    )


def count_instructions(args: argparse.Namespace, example: Path, collector: str, work: Path) -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    names = args.variants.split(",")
    counts = {}
    for name in names:
        counts[name] = instructions(name, args.requests, example, collector, work)
        print(f"{name}: {counts[name].total:,.0f} instructions a request", flush=True)
    print(f"\nexamples/mlp, {CALLERS[0]} concurrent callers in process, under callgrind\n")
    print(f"{'variant':<10} {'instructions/req':>17} {'ratio':>7}")
    base = counts[names[0]].total
    for name in names:
        print(f"{name:<10} {counts[name].total:>17,.0f} {counts[name].total / base:>6.2f}x")
    print("\nwhere they ran, instructions a request (callgrind_annotate, by library)\n")
    parts = sorted(
        {p for c in counts.values() for p in c.parts},
        key=lambda p: -counts[names[0]].parts.get(p, 0),
    )
    print(f"{'part':<38}" + "".join(f" {name:>10}" for name in names))
    for part in parts:
        values = [counts[name].parts.get(part, 0.0) for name in names]
        if max(values) >= 100:  # below: what start-up left in the difference
            print(f"{part:<38}" + "".join(f" {v:>10,.0f}" for v in values))


#: A function, as ``--bytecodes`` names it: (file under the project or site-packages,
#: name, first line).
Where = tuple[str, str, int]


def opcode_counter(
    counts: collections.Counter[Where], calls: collections.Counter[Where] | None = None
) -> Any:
    """A ``sys.settrace`` function that counts each frame's opcodes into ``counts``, and
    the Python calls (frames entered, a coroutine's resumptions among them) into ``calls``."""

    def where(frame: Any) -> Where:
        code = frame.f_code
        if code.co_filename == "<string>":  # a dataclass's generated __init__
            owner = frame.f_locals.get("self")
            return ("<string>", type(owner).__qualname__ if owner is not None else code.co_name, 0)
        path = code.co_filename.split("site-packages/")[-1]
        return (path.removeprefix(str(ROOT) + "/"), code.co_name, code.co_firstlineno)

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            counts[where(frame)] += 1
        elif event == "call" and calls is not None:
            calls[where(frame)] += 1
        return tracer

    return tracer


async def count_bytecodes(
    args: argparse.Namespace, work: Path, example: Path, collector: str
) -> None:
    payloads = bodies()
    names = args.variants.split(",")
    counts: dict[str, collections.Counter[Where]] = {}
    calls: dict[str, collections.Counter[Where]] = {}
    async with contextlib.AsyncExitStack() as stack:
        for name in names:
            app = await start(name, work, example, collector, stack)
            scope, message = request(*payloads[media(name)])
            await drive(app, scope, message, WARM)  # loads the model
            counts[name] = collections.Counter()
            calls[name] = collections.Counter()
            tracer = opcode_counter(counts[name], calls[name])
            sys.settrace(tracer)
            try:
                await drive(app, scope, message, args.requests)
            finally:
                sys.settrace(None)
    per = {name: {k: v / args.requests for k, v in c.items()} for name, c in counts.items()}
    totals = {name: sum(p.values()) for name, p in per.items()}
    entered = {name: sum(c.values()) / args.requests for name, c in calls.items()}
    print(f"\nexamples/mlp, {CALLERS[0]} concurrent callers in process, {args.requests} requests")
    print("traced (the event loop's thread)\n")
    print(f"{'variant':<10} {'bytecodes/req':>14} {'ratio':>7} {'calls/req':>10}")
    for name in names:
        print(
            f"{name:<10} {totals[name]:>14,.0f} {totals[name] / totals[names[0]]:>6.2f}x"
            f" {entered[name]:>10,.1f}"
        )
    print(f"\nthe {args.top} functions with the most bytecodes a request\n")
    print("".join(f"{name:>9}" for name in names) + "  function")
    top = sorted(
        {k for p in per.values() for k in p}, key=lambda k: -max(p.get(k, 0) for p in per.values())
    )
    for path, function, line in top[: args.top]:
        values = "".join(f"{per[name].get((path, function, line), 0.0):>9.1f}" for name in names)
        print(f"{values}  {function} ({path}:{line})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--variants",
        default="off,100%,msgpack,raw",
        help="comma-separated, of off, 100%%, msgpack and raw (off is the baseline)",
    )
    parser.add_argument("--rounds", type=int, default=8, help="interleaved timed rounds")
    parser.add_argument(
        "--requests",
        type=int,
        default=2048,
        help="requests a round (--instructions: how much longer its second run is)",
    )
    parser.add_argument(
        "--callers",
        type=int,
        default=CONCURRENCY,
        help=f"concurrent callers (default {CONCURRENCY}; 1: a lone request, a batch each)",
    )
    parser.add_argument("--profile", metavar="VARIANT", help="profile one more round of it")
    parser.add_argument("--top", type=int, default=30, help="functions the profile lists")
    counting = parser.add_mutually_exclusive_group()
    counting.add_argument(
        "--instructions",
        action="store_true",
        help="count machine instructions a request under valgrind instead of timing",
    )
    counting.add_argument(
        "--bytecodes",
        action="store_true",
        help="count Python bytecodes a request on the event loop's thread instead of timing",
    )
    parser.add_argument("--one", metavar="VARIANT", help=argparse.SUPPRESS)  # see run_one
    parser.add_argument("--example", help=argparse.SUPPRESS)
    parser.add_argument("--collector", help=argparse.SUPPRESS)
    args = parser.parse_args()
    CALLERS[0] = args.callers
    known = {"off", "100%", "msgpack", "100%msgpack", "raw"}
    chosen = args.variants.split(",")
    if set(chosen) - known or (args.profile and args.profile not in chosen):
        parser.error(f"--variants and --profile take {sorted(known)} (--profile one of those run)")
    if chosen[0] != "off" and "off" in chosen:  # off first: the baseline of the ratios
        chosen.remove("off")
        args.variants = ",".join(["off", *chosen])
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = Path(tempfile.mkdtemp(prefix="fnrt-bench-hotpath-"))
    if args.one:  # a run of --instructions: the example and the collector are given
        try:
            uvloop.run(run_one(args.one, args.requests, work, Path(args.example), args.collector))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    collector, sink = start_sink()
    try:
        example, _ = copy_mlp(work)
        if args.instructions:
            count_instructions(args, example, collector, work)
        elif args.bytecodes:
            uvloop.run(count_bytecodes(args, work, example, collector))
        else:
            uvloop.run(measure(args, work, example, collector))
    finally:
        sink.terminate()
        sink.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
