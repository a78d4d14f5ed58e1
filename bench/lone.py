"""Where a lone request's time goes: a timestamp at each hop of many single requests.

    python bench/lone.py [--variant off|100%|msgpack|100%msgpack] [--requests 2000]

One caller sends one request at a time to an fnrt app (``hotpath.py``'s: as
``fnrt serve`` builds it, the request log on, ``examples/mlp`` in a worker
process) through its ASGI interface, so every request is a batch of its own,
as at one connection. A ``time.perf_counter_ns`` is taken at each hop (the
methods named below are wrapped, which adds a call to each), and the median of
each stage over ``--requests`` requests is printed, from the request's start
and from the stage before:

1. queued: ``Batcher.submit`` returned (the body decoded, the call admitted);
2. taken: the slot's loop woke and takes the batch (``Batcher._take``);
3. send start / 4. sent: the batch written into the request arena and its
   message sent (``ProcessInstance._send``);
5. reply woke loop / 6. reply read: the loop found the worker's reply on the
   socket (``Channel._readable`` returned, where a task reads it), and the
   reply read from the socket and the response arena (``process._ran``);
7. answering / 8. futures set: ``Batcher._answer``;
9. response start / 10. body sent / 11. app returned: the route's answer.

Between 4 and 5 is the worker's part: its wake-up, the batch read from the
arena, the handler (its ``infer_s + output_s`` printed apart), the reply, and
the event loop's wake-up. No socket and no HTTP parsing: ``invoke.py``'s one
connection figure has both. Wall-clock: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hotpath
import uvloop
from loadgen import copy_mlp

from fnrt.loader import channel, process
from fnrt.runtime.batcher import Batcher
from tracing import start_sink

marks: dict[str, int] = {}


def stamp(label: str) -> None:
    marks.setdefault(label, time.perf_counter_ns())


def wrap(owner: Any, name: str, label: str, *, after: bool = False) -> None:
    """Stamp ``label`` when ``owner.name`` is called (or has returned, ``after``)."""
    original: Callable[..., Any] = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not after:
            stamp(label)
        result = original(*args, **kwargs)
        if after:
            stamp(label)
        return result

    setattr(owner, name, wrapped)


def instrument(handler_us: list[float]) -> None:
    wrap(Batcher, "submit", "1 queued", after=True)
    wrap(Batcher, "_take", "2 taken")
    wrap(process.ProcessInstance, "_send", "3 send start")
    wrap(process.ProcessInstance, "_send", "4 sent", after=True)
    wrap(Batcher, "_answer", "7 answering")
    wrap(Batcher, "_answer", "8 futures set", after=True)
    readable = channel.Channel._readable  # a reply read by a task (a batch sent ahead)

    async def woke(self: channel.Channel) -> None:
        await readable(self)
        stamp("5 reply woke loop")

    channel.Channel._readable = woke  # type: ignore[method-assign]
    ran = process._ran

    def read(responses: Any, reply: dict[str, Any]) -> Any:
        stamp("5 reply woke loop")
        out = ran(responses, reply)
        stamp("6 reply read")
        handler_us.append((out.infer_s + out.output_s) * 1e6)
        return out

    process._ran = read  # type: ignore[assignment]


def stamping(app: Any) -> Any:
    """``app``, stamping its answer's start and body as it sends them."""

    async def stamped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def stamped_send(sent: dict[str, Any]) -> None:
            stamp("9 response start" if sent["type"] == "http.response.start" else "10 body sent")
            await send(sent)

        await app(scope, receive, stamped_send)

    return stamped


async def lone(
    app: Any, scope: dict[str, Any], message: dict[str, Any]
) -> tuple[int, dict[str, int]]:
    """One request (``hotpath.py``'s, through ``stamping(app)``); when it started and
    the stamps it left."""
    marks.clear()
    started = time.perf_counter_ns()
    status = await hotpath.invoke(app, scope, message)
    marks["11 app returned"] = time.perf_counter_ns()
    if status != 200:
        raise SystemExit(f"an invoke answered {status}")
    return started, dict(marks)


async def measure(args: argparse.Namespace, work: Path, example: Path, collector: str) -> None:
    handler_us: list[float] = []
    instrument(handler_us)
    async with contextlib.AsyncExitStack() as stack:
        app = stamping(await hotpath.start(args.variant, work, example, collector, stack))
        scope, message = hotpath.request(*hotpath.bodies()[hotpath.media(args.variant)])
        for _ in range(200):  # loads the model, warms the path
            await lone(app, scope, message)
        handler_us.clear()
        rows = [await lone(app, scope, message) for _ in range(args.requests)]
    labels = sorted({k for _, m in rows for k in m}, key=lambda k: int(k.split()[0]))
    print(f"\n{args.variant}: {args.requests} lone requests, median microseconds\n")
    print_stages(rows, labels, "stage", 1000, 1)
    print(f"\nthe worker's handler (infer_s + output_s): {statistics.median(handler_us):.1f}")


def print_stages(
    rows: list[tuple[int, dict[str, int]]], labels: list[str], head: str, per: int, digits: int
) -> None:
    """Each stage's median (its ``perf_counter_ns`` stamps divided by ``per``) from the
    start of its row and from the stage before, in the order of ``labels``."""
    print(f"{head:<22} {'from start':>11} {'from before':>12}")
    before = ""
    for label in labels:
        total = [(m[label] - t) / per for t, m in rows if label in m]
        step = [(m[label] - m[before]) / per for _, m in rows if label in m and before in m]
        print(
            f"{label:<22} {statistics.median(total):>11.{digits}f} "
            f"{statistics.median(step or total):>12.{digits}f}"
        )
        before = label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--variant", default="off", choices=["off", "100%", "msgpack", "100%msgpack"]
    )
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = Path(tempfile.mkdtemp(prefix="fnrt-bench-lone-"))
    collector, sink = start_sink()
    try:
        example, _ = copy_mlp(work)
        uvloop.run(measure(args, work, example, collector))
    finally:
        sink.terminate()
        sink.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
