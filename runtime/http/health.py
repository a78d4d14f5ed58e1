"""``/healthz`` (the process answers) and ``/readyz`` (it can serve: the store answers)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from fnrt.runtime.http.state import node_of


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> JSONResponse:
    node = node_of(request)
    if not request.app.state.started:
        return JSONResponse({"status": "starting"}, status_code=503)
    try:
        await asyncio.wait_for(asyncio.to_thread(node.registry.repository.list_functions), 5)
    except Exception as exc:
        return JSONResponse({"status": "unavailable", "error": f"store: {exc}"}, status_code=503)
    return JSONResponse({"status": "ready"})


routes = [Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"])]
