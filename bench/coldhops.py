"""Where a cold start from L2 spends its time: a timestamp at each hop of its call.

    python bench/coldhops.py [--rounds 8] [--layers 16]

``bench/coldstart.py``'s model (256 MiB of safetensors at 16 layers) served by an
fnrt app as ``fnrt serve`` builds it (``hotpath.py``'s: a worker process, the
request log on), called through its ASGI interface (no socket, no HTTP parsing).
Each round unloads the function, waits ``SPARE_READY_S`` for the spare worker,
wakes it with one call, and measures the floor (``coldstart.py``'s: the model
built on the ``meta`` device, its weights mapped and its first forward, in this
process). A ``time.perf_counter_ns`` is taken at each hop (the methods named
below are wrapped, which adds a call to each):

1. queued: ``Batcher.submit`` returned (the body decoded, the call admitted);
2. load begins: ``InstancePool._load`` called;
3. files readied: ``launch.prepare`` returned (fetched, checked, pinned);
4. load message sent: ``ProcessInstance.start`` called (room made, a spare
   taken, its arenas made);
5. load replied: the worker's reply read (its part: the handler's import and
   ``load``, printed apart from the load's recorded stages);
6. in its slot: ``InstancePool._load`` returned (the watch on its files, the
   hop back to the event loop);
7. first batch sent: ``ProcessInstance._send`` returned (right behind the load
   message: before 5);
8. reply read: the first batch's reply (its part: the forward);
9. response start, 10. app returned: the answer.

Printed: each round's hops in the order they came, then each hop's median, the wake's median against
the floor's, and the worker's recorded parts. Wall-clock: run it on a quiet
machine, and compare trees with ``coldstart_ab.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hotpath
import numpy as np
import orjson
import uvloop
from coldstart import SPARE_READY_S, build_models, floor_in_process
from lone import print_stages

from fnrt.loader import launch, process
from fnrt.loader.process import ProcessInstance
from fnrt.runtime.batcher import Batcher
from fnrt.runtime.pool import InstancePool

marks: dict[str, int] = {}


def stamp(label: str) -> None:
    marks.setdefault(label, time.perf_counter_ns())


def wrap(owner: Any, name: str, label: str, *, after: bool = False) -> None:
    """Stamp ``label`` when ``owner.name`` is called (or has returned, ``after``)."""
    original: Callable[..., Any] = getattr(owner, name)
    if asyncio.iscoroutinefunction(original):

        async def waited(*args: Any, **kwargs: Any) -> Any:
            if not after:
                stamp(label)
            result = await original(*args, **kwargs)
            if after:
                stamp(label)
            return result

        setattr(owner, name, functools.wraps(original)(waited))
        return

    def called(*args: Any, **kwargs: Any) -> Any:
        if not after:
            stamp(label)
        result = original(*args, **kwargs)
        if after:
            stamp(label)
        return result

    setattr(owner, name, functools.wraps(original)(called))


def instrument() -> None:
    wrap(Batcher, "submit", "1 queued", after=True)
    wrap(InstancePool, "_load", "2 load begins")
    wrap(launch, "prepare", "3 files readied", after=True)
    wrap(ProcessInstance, "start", "4 load message sent")
    wrap(ProcessInstance, "start", "5 load replied", after=True)
    wrap(InstancePool, "_load", "6 in its slot", after=True)
    wrap(ProcessInstance, "_send", "7 first batch sent", after=True)
    ran = process._ran

    def read(responses: Any, reply: dict[str, Any]) -> Any:
        out = ran(responses, reply)
        stamp("8 reply read")
        return out

    process._ran = read


def stamping(app: Any) -> Any:
    """``app``, stamping its answer's start as it sends it."""

    async def stamped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def stamped_send(sent: dict[str, Any]) -> None:
            if sent["type"] == "http.response.start":
                stamp("9 response start")
            await send(sent)

        await app(scope, receive, stamped_send)

    return stamped


async def described(app: Any, name: str) -> dict[str, Any]:
    """``GET /v1/functions/{name}`` through ``app``: the function's description."""
    scope, message = hotpath.request(b"", b"application/json")
    path = f"/v1/functions/{name}"
    scope = dict(scope, method="GET", path=path, raw_path=path.encode())
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        return message

    async def send(sent: dict[str, Any]) -> None:
        if sent["type"] == "http.response.body":
            chunks.append(sent.get("body", b""))

    await app(scope, receive, send)
    described: dict[str, Any] = orjson.loads(b"".join(chunks))
    return described


def post(path: str, body: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    scope, message = hotpath.request(body, b"application/json")
    return dict(scope, path=path, raw_path=path.encode()), message


async def measure(args: argparse.Namespace, work: Path) -> None:
    wide, _, _ = build_models(work, args.layers)
    weights = wide / "weights.safetensors"
    x = np.random.default_rng(1).standard_normal((1, 2048)).astype(np.float32)
    invoke = post("/v1/functions/wide/invoke", orjson.dumps({"x": x.tolist()}))
    unload = post("/v1/functions/wide/unload", b"")
    instrument()
    rows: list[tuple[int, dict[str, int]]] = []
    wakes, floors, parts = [], [], []
    async with contextlib.AsyncExitStack() as stack:
        app = await hotpath.start("off", work, wide, "", stack)
        stamped = stamping(app)
        assert await hotpath.invoke(app, *invoke) == 200  # its first cold start: not measured
        # this process imported torch (the floor): out of the collector, as a server
        # freezes what a load made, so no full collection of it lands in a wake
        gc.freeze()
        for n in range(1, args.rounds + 1):
            assert await hotpath.invoke(app, *unload) == 200
            await asyncio.sleep(SPARE_READY_S)
            marks.clear()
            started = time.perf_counter_ns()
            assert await hotpath.invoke(stamped, *invoke) == 200
            marks["10 app returned"] = time.perf_counter_ns()
            rows.append((started, dict(marks)))
            parts.append((await described(app, "wide"))["instance"]["last_load_timings_s"])
            floor = floor_in_process(weights, args.layers, x)
            wakes.append((marks["10 app returned"] - started) / 1e9)
            floors.append(floor)
            ordered = sorted(marks.items(), key=lambda kv: kv[1])  # in the order they came
            times = [started] + [v for _, v in ordered]
            hops = " ".join(
                f"{k.split()[0]}:{(v - times[i]) / 1e6:.2f}" for i, (k, v) in enumerate(ordered)
            )
            print(
                f"round {n}: wake {wakes[-1] * 1e3:.1f} ms, floor {floor * 1e3:.1f} ms; "
                f"hops (ms from the one before) {hops}",
                flush=True,
            )

    def when(label: str) -> float:
        return statistics.median(m[label] - t for t, m in rows if label in m)

    labels = sorted({k for _, m in rows for k in m}, key=when)  # in the order they came
    print(f"\n{args.rounds} cold starts from L2 ({args.layers} layers), median ms\n")
    print_stages(rows, labels, "hop", 1_000_000, 2)
    ratios = [w / f for w, f in zip(wakes, floors, strict=True)]
    print(
        f"\nwake {statistics.median(wakes) * 1e3:.1f} ms, floor "
        f"{statistics.median(floors) * 1e3:.1f} ms: wake / floor {statistics.median(ratios):.2f}x "
        f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})"
    )
    recorded = ("import_s", "load_s", "setup_s", "first_batch_s")
    print(
        "the load's recorded parts, median ms: "
        + ", ".join(
            f"{k[:-2]} {statistics.median(p.get(k, 0.0) for p in parts) * 1e3:.2f}"
            for k in recorded
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--layers", type=int, default=16, help="16 layers = 256 MiB")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="fnrt-bench-coldhops-"))
    try:
        uvloop.run(measure(args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
