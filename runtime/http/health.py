"""``/healthz`` (the process answers), ``/readyz`` (it can serve: the store answers)
and ``/metrics`` (Prometheus text)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fnrt.runtime.http.state import node_of
from fnrt.tracing.metrics import CONTENT_TYPE


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def not_ready(request: Request) -> str | None:
    """Why the node cannot serve yet ("starting", or the store's error), or None when it can."""
    if not request.app.state.started:
        return "starting"
    try:
        await asyncio.wait_for(asyncio.to_thread(node_of(request).repository.list_functions), 5)
    except Exception as exc:
        return f"store: {exc}"
    return None


async def readyz(request: Request) -> JSONResponse:
    reason = await not_ready(request)
    if reason == "starting":
        return JSONResponse({"status": "starting"}, status_code=503)
    if reason is not None:
        return JSONResponse({"status": "unavailable", "error": reason}, status_code=503)
    return JSONResponse({"status": "ready"})


async def metrics(request: Request) -> Response:
    body = node_of(request).telemetry.metrics.exposition()
    return Response(body, headers={"content-type": CONTENT_TYPE})


routes = [
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]
