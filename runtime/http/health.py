"""``/healthz`` (the process answers) and ``/readyz`` (it can serve: the store answers)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from fnrt.runtime.http.state import node_of


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def not_ready(request: Request) -> str | None:
    """Why the node cannot serve yet ("starting", or the store's error), or None when it can."""
    if not request.app.state.started:
        return "starting"
    try:
        await asyncio.wait_for(
            asyncio.to_thread(node_of(request).registry.repository.list_functions), 5
        )
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


routes = [Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"])]
