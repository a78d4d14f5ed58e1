"""Why mypyc does not pay on fnrt's request path: the three kinds of work it does, alone.

    python bench/compiled_micro.py [--iterations 1000000]

Writes a small module in a temporary folder, times three loops interpreted,
compiles the module with mypyc (needs mypy and a C compiler) and times them
again, in processes of their own; prints CPU nanoseconds an iteration and
compiled / interpreted. The loops stand for what ``bench/compiled.py``
compiles in fnrt:

- ``glue``: compiled code reading attributes of and calling methods on plain
  Python objects (fnrt's node, gateway, scheduler, futures, arrays: most of
  what the hot modules do);
- ``record``: building a slotted dataclass (the request's ``Call``), which
  mypyc makes a native class;
- ``read``: interpreted code reading that record's fields (everything outside
  the compiled modules that reads a ``Call``);
- ``await``: interpreted code awaiting a compiled coroutine that awaits another.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PLAIN = """
class Node:
    def __init__(self) -> None:
        self.gateway = self
        self.telemetry = None
        self.keys: dict[str, int] = {"a": 1}

    def choose(self, x: int) -> int:
        return x + 1
"""

HOT = """
from __future__ import annotations
from dataclasses import dataclass
from typing import Any
from plain import Node

@dataclass(eq=False, slots=True)
class Record:
    rows: int
    future: Any
    deadline: float | None = None
    started: bool = False

def glue(node: Node, n: int) -> int:
    total = 0
    for i in range(n):
        gateway = node.gateway
        if gateway.telemetry is None:
            total += gateway.choose(i)
        total += node.keys["a"]
    return total

def record(n: int) -> Record:
    last = Record(0, None)
    for i in range(n):
        last = Record(i, last, 1.0, True)
    return last

async def leaf(x: int) -> int:
    return x

async def middle(x: int) -> int:
    return await leaf(x) + 1
"""

TIMER = """
import sys, time
import hot
from plain import Node

def read(r, n):
    total = 0
    for _ in range(n):
        total += r.rows
        if r.started:
            total += 1
        r.future
    return total

async def awaiting(n):
    total = 0
    for i in range(n):
        total += await hot.middle(i)
    return total

def drive(n):
    try:
        awaiting(n).send(None)
    except StopIteration:
        pass

n = int(sys.argv[1])
loops = {
    "glue": (hot.glue, (Node(), n)),
    "record": (hot.record, (n,)),
    "read": (read, (hot.record(1), n)),
    "await": (drive, (n,)),
}
for name, (f, args) in loops.items():
    times = []
    for _ in range(5):
        start = time.process_time()
        f(*args)
        times.append(time.process_time() - start)
    print(name, min(times) * 1e9 / n)
"""


def timed(folder: Path, iterations: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "timer.py", str(iterations)],
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
        env=os.environ | {"PYTHONPATH": str(folder)},
    )
    return {name: float(ns) for name, ns in (line.split() for line in done.stdout.splitlines())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fnrt-bench-micro-") as work:
        folder = Path(work)
        for name, text in (("plain.py", PLAIN), ("hot.py", HOT), ("timer.py", TIMER)):
            (folder / name).write_text(text)
        interpreted = timed(folder, args.iterations)
        subprocess.run(
            [sys.executable, "-m", "mypyc", "hot.py"], cwd=folder, check=True, capture_output=True
        )
        assert list(folder.glob("hot.*.so")), "mypyc made no extension"
        compiled = timed(folder, args.iterations)
    print(f"{'loop':<8} {'interpreted ns':>15} {'compiled ns':>12} {'ratio':>7}")
    for name, ns in interpreted.items():
        print(f"{name:<8} {ns:>15.1f} {compiled[name]:>12.1f} {compiled[name] / ns:>6.2f}x")


if __name__ == "__main__":
    main()
