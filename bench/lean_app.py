"""The least a batching server in Python must do: the design floor for the serving benchmarks.

The raw ASGI app (``raw_app.py``) is the floor of the HTTP stack: it runs no
model. This app is the floor of the *design*: on the same stack (uvicorn,
uvloop, httptools, one process) it reads the body, parses it (orjson, or
msgpack), makes the array, queues it with a future, and a task on the event
loop runs whatever queued (up to 32, as the ``mlp`` manifest's batch) through
the model inline and answers each request from its rows. Nothing else: no
validation beyond the array's dtype, no routing, no admission, no isolation of
the model (it runs on the loop's own thread), no metrics, no request log, no
tracing. Whatever fnrt spends beyond this buys one of those.
Run as ``python bench/lean_app.py EXAMPLE_DIR WEIGHTS PORT``.

The same server as an RSGI app on Granian (``bench/stacks.py``):
``LEAN_EXAMPLE=DIR LEAN_WEIGHTS=FILE granian --interface rsgi --factory lean_app:rsgi``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
import msgpack_numpy
import numpy as np
import orjson
from bare_app import model_runner
from raw_app import serve

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Runner = Callable[[np.ndarray], np.ndarray]

MAX_BATCH = 32
JSON = b"application/json"
MSGPACK = b"application/msgpack"


class Lean:
    """Requests queued with a future each; one task runs them in batches."""

    def __init__(self, run: Runner) -> None:
        self.run = run
        self.pending: list[tuple[np.ndarray, asyncio.Future[np.ndarray]]] = []
        self.wake: asyncio.Event | None = None

    async def batches(self) -> None:
        assert self.wake is not None
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.pending:
                batch = self.pending[:MAX_BATCH]
                del self.pending[:MAX_BATCH]
                y = self.run(np.concatenate([x for x, _ in batch]))
                start = 0
                for x, future in batch:
                    future.set_result(y[start : start + len(x)])
                    start += len(x)
                await asyncio.sleep(0)  # let the answered requests answer

    def _start(self) -> asyncio.Event:
        if self.wake is None:
            self.wake = asyncio.Event()
            asyncio.get_running_loop().create_task(self.batches())
        return self.wake

    async def answer(self, body: bytes, msgpacked: bool) -> tuple[bytes, bytes]:
        """The answer to one request's body, and its media type."""
        wake = self._start()
        if msgpacked:
            data = msgpack.unpackb(body, object_hook=msgpack_numpy.decode)
        else:
            data = orjson.loads(body)
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self.pending.append((np.asarray(data["x"], dtype=np.float32), future))
        wake.set()
        y = await future
        if msgpacked:
            return msgpack.packb({"y": y}, default=msgpack_numpy.encode), MSGPACK
        return orjson.dumps({"y": y}, option=orjson.OPT_SERIALIZE_NUMPY), JSON

    async def rsgi(self, scope: Any, proto: Any) -> None:
        """The same, as an RSGI app."""
        if scope.method != "POST":  # the readiness probe
            proto.response_empty(405, [])
            return
        body = await proto()
        out, media = await self.answer(
            body, scope.headers.get("content-type") == "application/msgpack"
        )
        proto.response_bytes(200, [("content-type", media.decode())], out)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":  # the readiness probe
            await send({"type": "http.response.start", "status": 405, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        out, media = await self.answer(body, (b"content-type", MSGPACK) in scope["headers"])
        headers = [(b"content-type", media), (b"content-length", str(len(out)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": out})


def build(example: Path, weights: Path) -> Lean:
    return Lean(model_runner(example, weights))


def rsgi() -> Callable[[Any, Any], Awaitable[None]]:
    """Granian's factory: the app of ``LEAN_EXAMPLE`` with ``LEAN_WEIGHTS``, as RSGI."""
    return build(Path(os.environ["LEAN_EXAMPLE"]), Path(os.environ["LEAN_WEIGHTS"])).rsgi


if __name__ == "__main__":
    app = build(Path(sys.argv[1]), Path(sys.argv[2]))
    serve(app, int(sys.argv[3]))
