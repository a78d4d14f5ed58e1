"""``/healthz`` (the process answers), ``/readyz`` (it can serve: started, not
draining, the functions that load at start warm, the store answers) and
``/metrics`` (Prometheus text)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from fnrt.runtime.http.state import node_of
from fnrt.runtime.lifecycle import Phase
from fnrt.tracing.exposition import chunks
from fnrt.tracing.metrics import CONTENT_TYPE, Metrics


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


#: The longest a readiness probe waits on the store.
STORE_CHECK_TIMEOUT_S = 5.0


async def not_ready(request: Request) -> tuple[str, str] | None:
    """Why the node cannot take requests (a status and what it means), or None."""
    node = node_of(request)
    lifecycle = node.lifecycle
    if lifecycle.draining:
        return "draining", "the node is stopping: send requests to another"
    if lifecycle.phase is Phase.STARTING:
        return "starting", "reading the store"
    warming = lifecycle.still_warming()
    if warming:
        return "starting", f"{warming} function(s) that load at start are still loading"
    store = node.repository.store.uri
    bound = asyncio.timeout(STORE_CHECK_TIMEOUT_S)
    try:  # one conditional GET (a 304 while nothing changed)
        async with bound:
            await asyncio.shield(_store_check(node))
    except TimeoutError as exc:
        if not bound.expired():  # the store's own (its client's read timeout): its reason
            return "unavailable", f"store {store}: {_reason(exc)}"
        return "unavailable", f"store {store}: no answer within {STORE_CHECK_TIMEOUT_S:g} s"
    except Exception as exc:
        return "unavailable", f"store {store}: {_reason(exc)}"
    return None


#: The store check under way, per node: probes that arrive while the store hangs wait
#: for that one (a thread each would pile up in the default executor for as long as
#: the store's deadline).
_checks: weakref.WeakKeyDictionary[Any, asyncio.Future[None]] = weakref.WeakKeyDictionary()


def _store_check(node: Any) -> asyncio.Future[None]:
    check = _checks.get(node)
    if check is None or check.done():
        check = asyncio.ensure_future(node.registry.feed.store_answers())
        check.add_done_callback(_retrieved)
        _checks[node] = check
    return check


def _retrieved(check: asyncio.Future[None]) -> None:
    """Take the error of a check nobody waited for to the end (it is the next probe's)."""
    if not check.cancelled():
        check.exception()


def _reason(exc: BaseException) -> str:
    """What went wrong, never empty (a timeout's ``str`` is)."""
    message = getattr(exc, "message", None) or str(exc)
    return message if message else repr(exc)


async def readyz(request: Request) -> JSONResponse:
    reason = await not_ready(request)
    if reason is not None:
        status, error = reason
        return JSONResponse({"status": status, "error": error}, status_code=503)
    return JSONResponse({"status": "ready"})


#: How much of the ``/metrics`` body is sent at once.
METRICS_CHUNK_BYTES = 1 << 18


async def metrics(request: Request) -> Response:
    """Prometheus text, sent in pieces as it is made: a node of thousands of functions
    has tens of megabytes of series, and the loop serves requests between families.
    (A family that fails to be made ends the body short: the scrape fails, as with a
    500.) An HTTP/1.0 client, which knows no chunks, gets it whole."""
    telemetry = node_of(request).telemetry
    telemetry.settle()  # the requests and batches that ended before this one
    metrics = telemetry.metrics
    if request.scope.get("http_version") == "1.0":
        body = b"".join([piece async for piece in _exposition(metrics)])
        return Response(body, headers={"content-type": CONTENT_TYPE})
    return StreamingResponse(_exposition(metrics), headers={"content-type": CONTENT_TYPE})


async def _exposition(metrics: Metrics) -> AsyncIterator[bytes]:
    for family in metrics.families():
        for piece in chunks(family, METRICS_CHUNK_BYTES):
            yield piece
        await asyncio.sleep(0)  # what arrived meanwhile is served before the next family


routes = [
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]
