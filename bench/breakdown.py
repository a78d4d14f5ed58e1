"""Where one request's time goes on a server's event-loop thread, from py-spy samples.

``profile_under_load`` runs ``py-spy record`` on a server while ``wrk`` loads it,
keeps the samples of the event loop's thread (its main thread), and sorts each
into a part of the request path by the innermost frame that belongs to one
(a numpy frame under ``functions/tensors.py`` counts as decoding). Shares times
the thread's CPU per request give microseconds per request. py-spy stops the
server for each sample (100 a second): sampling without stopping it
(``--nonblocking``) often cannot unwind the coroutines being resumed, and put
half of fnrt's time in the event loop itself. The event loop's part is what
py-spy saw with no deeper Python frame: uvloop and the task machinery in C. py-spy comes from
the package index (``pip install py-spy``); it reads another process's memory,
which needs ptrace rights (root, or ``kernel.yama.ptrace_scope=0``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from loadgen import Result, stat_cpu_s, wrk

#: (part, path fragments of its frames), in the order a frame is tested. Frames are
#: py-spy's ``function (path:line)``; the first part whose fragment a frame's text
#: holds claims the sample, walking from the innermost frame out.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("telemetry: metrics, request log, spans", ("tracing/", "prometheus_client/", "observe.py")),
    ("decode and check inputs", ("decode", "tensors.py", "body.py", "limits.py")),
    ("encode the answer", ("encode",)),
    (
        "route, guards, admission, queue",
        (
            "gateway.py",
            "guards.py",
            "scheduler.py",
            "registry.py",
            "queue.py",
            "protection.py",
            "breaker.py",
            "served.py",
            "routing.py",
            "keeper.py",
            "intake.py",
            "submit (runtime/batcher.py",
            "submit (runtime/sequencer.py",
            "starts.py",
        ),
    ),
    (
        "batches: the loop, hand-off to the instance",
        ("batcher.py", "pool.py", "events.py", "process.py", "instance.py", "arena.py", "futures"),
    ),
    ("socket writes (one writev an answer)", ("_flush (runtime/http/connection.py",)),
    ("fnrt's HTTP glue: headers, answers", ("runtime/http/",)),
    ("uvicorn: HTTP parsing, ASGI", ("uvicorn/", "httptools", "starlette/")),
    ("event loop, task steps (no deeper frame seen)", ("Runner.run", "uvloop")),
)
OTHER = "other"


@dataclass(frozen=True)
class Breakdown:
    result: Result  # the wrk run it was sampled under
    shares: dict[str, float]  # part -> fraction of the loop thread's busy samples
    loop_cpu_us: float  # the event-loop thread's CPU per request
    samples: int


def py_spy() -> str | None:
    """py-spy's path: beside this Python, or on PATH; None when absent."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def thread_cpu_s(pid: int, tid: int) -> float:
    """CPU seconds (user and system) of one thread of ``pid``."""
    return stat_cpu_s(Path(f"/proc/{pid}/task/{tid}/stat"))


def part_of(frames: list[str]) -> str:
    """The part of the request path a sample's stack (outermost first) was in."""
    for frame in reversed(frames):
        for part, fragments in PARTS:
            if any(f in frame for f in fragments):
                return part
    return OTHER


def read_samples(path: Path, main_frame: str) -> Counter[str]:
    """Samples by part, for stacks whose outermost frame holds ``main_frame``."""
    parts: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit() or not stack:
            continue
        frames = stack.split(";")
        if main_frame in frames[0]:
            parts[part_of(frames)] += int(count)
    return parts


def profile_under_load(
    pid: int,
    url: str,
    script: Path,
    connections: int,
    duration_s: int,
    work: Path,
    main_frame: str = "<module>",
) -> Breakdown | None:
    """Sample server ``pid``'s event-loop thread while ``wrk`` loads ``url``; None
    (and a line saying why) when py-spy is missing or may not attach."""
    spy = py_spy()
    if spy is None:
        print("no breakdown: py-spy is not installed (pip install py-spy)")
        return None
    out = work / f"py-spy-{pid}.txt"
    argv = [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "100"]
    argv += ["--duration", str(duration_s + 1), "--output", str(out)]
    sampler = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    cpu_before = thread_cpu_s(pid, pid)
    result = wrk(url, script, connections, duration_s)
    loop_cpu_s = thread_cpu_s(pid, pid) - cpu_before
    _, err = sampler.communicate(timeout=60)
    if sampler.returncode != 0 or not out.exists():
        print(f"no breakdown: py-spy failed: {err.decode(errors='replace').strip()[-300:]}")
        return None
    parts = read_samples(out, main_frame)
    total = sum(parts.values())
    if not total:
        print("no breakdown: py-spy took no samples of the event loop's thread")
        return None
    requests = max(result.rps * duration_s, 1.0)
    return Breakdown(
        result,
        {part: n / total for part, n in parts.most_common()},
        loop_cpu_s / requests * 1e6,
        total,
    )


def print_breakdown(name: str, breakdown: Breakdown, floor_us: float | None = None) -> None:
    """The parts of ``breakdown`` as a table: share of samples, microseconds a request."""
    print(
        f"\nwhere a {name} request's time goes on the event loop's thread "
        f"({breakdown.samples} py-spy samples under load, "
        f"{breakdown.result.rps:.0f} req/s while sampled):\n"
    )
    print(f"{'part':<46} {'share':>6} {'us/req':>7}")
    for part, share in breakdown.shares.items():
        print(f"{part:<46} {share:>6.1%} {share * breakdown.loop_cpu_us:>7.1f}")
    print(f"{'all (the thread CPU a request)':<46} {1:>6.0%} {breakdown.loop_cpu_us:>7.1f}")
    if floor_us is not None:
        print(f"{'the raw ASGI app, all (the HTTP floor)':<46} {'':>6} {floor_us:>7.1f}")
