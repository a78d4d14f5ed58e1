"""The Open Inference Protocol's other routes: health, metadata, readiness, config,
statistics, and the model-repository extension mapped onto fnrt's deploy state.

A model is a deployed function; its versions are fnrt's version ids. A model
is *ready* when it is deployed and its last load did not fail: a function
scaled to zero still answers (its next request loads it), so ``unload``
(scale to zero) leaves it ready. Repository routes are admin routes.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fnrt.functions.errors import BadRequest
from fnrt.runtime import scheduler as sched
from fnrt.runtime import views
from fnrt.runtime.access import allows, require_key
from fnrt.runtime.http.admin import admin
from fnrt.runtime.http.body import read_body
from fnrt.runtime.http.health import not_ready
from fnrt.runtime.http.oip.triton import model_config, model_metadata, model_statistics
from fnrt.runtime.http.state import node_of, server_version
from fnrt.runtime.pool import InstanceState
from fnrt.runtime.scheduler import Scheduler

#: Extensions of the protocol fnrt implements (``GET /v2``).
EXTENSIONS = [
    "binary_tensor_data",
    "model_repository",
    "statistics",
    "model_configuration",
    "parameters",
]
_MAX_CONTROL_BYTES = 1024 * 1024


def _version(request: Request) -> str | None:
    version: str | None = request.path_params.get("version")
    return version


async def live(request: Request) -> Response:
    return JSONResponse({"live": True})


async def ready(request: Request) -> Response:
    reason = await not_ready(request)
    if reason is not None:
        return JSONResponse({"ready": False, "error": reason[1]}, status_code=503)
    return JSONResponse({"ready": True})


async def server_metadata(request: Request) -> Response:
    return JSONResponse({"name": "fnrt", "version": server_version(), "extensions": EXTENSIONS})


def _may_see(request: Request) -> str:
    """The model the path names, once the caller may see it: a function with invoke keys
    shows its metadata, config, readiness and counters only to a caller with one, as it
    answers its inferences (401)."""
    name: str = request.path_params["name"]
    require_key(node_of(request).invoke_keys, name, request.headers)
    return name


async def model(request: Request) -> Response:
    registry = node_of(request).registry
    name, version = _may_see(request), _version(request)
    vm = await registry.version_manifest(name, version, fresh=False)
    versions = [vm.version] if version is not None else await views.stored_versions(registry, name)
    return JSONResponse(model_metadata(vm, versions))


async def model_ready(request: Request) -> Response:
    registry = node_of(request).registry
    name, version = _may_see(request), _version(request)
    vm = await registry.version_manifest(name, version, fresh=False)
    failing = [
        s.stats.last_load_error
        for s in registry.versions_of(name)
        if s.version.version == vm.version and s.stats.last_load_error and not s.pool.instances
    ]
    body: dict[str, Any] = {"name": name, "version": vm.version, "ready": not failing}
    if failing:
        body["error"] = failing[0]
        return JSONResponse(body, status_code=503)
    return JSONResponse(body)


async def config(request: Request) -> Response:
    node = node_of(request)
    vm = await node.registry.version_manifest(_may_see(request), _version(request), fresh=False)
    return JSONResponse(model_config(vm, node.loader.device.kind))


async def statistics(request: Request) -> Response:
    """Counters of the versions this node serves (each node counts its own): of every
    model, those the caller may call (a function with invoke keys counts only for a
    caller with one)."""
    node = node_of(request)
    registry = node.registry
    name = _may_see(request) if "name" in request.path_params else None
    version = _version(request)
    schedulers: list[Scheduler]
    if name is None:
        keys, headers = node.invoke_keys, request.headers
        schedulers = [s for s in node.schedulers() if allows(keys, s.name, headers)]
    elif version is None:
        await registry.entry(name, fresh=False)
        schedulers = registry.versions_of(name)
    else:
        schedulers = [await registry.get_version(name, version)]
    stats = [model_statistics(s.name, s.version.version, s.stats) for s in schedulers]
    return JSONResponse({"model_stats": stats})


@admin
async def repository_index(request: Request) -> Response:
    """Every deployed function with the version it serves and its state."""
    body = await _control_body(request)
    registry = node_of(request).registry
    entries = []
    summaries, _ = await views.summaries(registry)  # all of them: Triton's index does not page
    for summary in summaries:
        state = summary["state"]
        entry = {
            "name": summary["name"],
            "version": summary["version"],
            "state": "LOADING" if state == InstanceState.LOADING.value else "READY",
            "reason": "scaled to zero: the next request loads it" if state == "cold" else "",
        }
        entries.append(entry)
    if body.get("ready") is True:
        entries = [e for e in entries if e["state"] == "READY"]
    return JSONResponse(entries)


@admin
async def repository_load(request: Request) -> Response:
    """Load (warm) the function's routed version now."""
    parameters = (await _control_body(request)).get("parameters") or {}
    if not isinstance(parameters, dict):
        raise BadRequest("'parameters' must be an object")
    if "config" in parameters or any(str(k).startswith("file:") for k in parameters):
        raise BadRequest(
            "fnrt loads what `fnrt deploy` published: config and file overrides are not supported"
        )
    scheduler = await node_of(request).registry.get(request.path_params["name"])
    await sched.warm(scheduler)
    return JSONResponse(_state(scheduler))


@admin
async def repository_unload(request: Request) -> Response:
    """Scale the function to zero now (it still answers: the next request loads it)."""
    await _control_body(request)
    node = node_of(request)
    scheduler = await node.registry.get(request.path_params["name"])
    await sched.scale_to_zero(scheduler, node.clock.now(), force=True)
    return JSONResponse(_state(scheduler))


def _state(scheduler: Scheduler) -> dict[str, Any]:
    return {
        "name": scheduler.name,
        "version": scheduler.version.version,
        "state": scheduler.pool.state.value,
    }


async def _control_body(request: Request) -> dict[str, Any]:
    raw = await read_body(request.headers, request.receive, _MAX_CONTROL_BYTES)
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    return body


_MODEL = "/v2/models/{name}"
_VERSION = "/v2/models/{name}/versions/{version}"

routes = [
    Route("/v2/health/live", live, methods=["GET"]),
    Route("/v2/health/ready", ready, methods=["GET"]),
    Route("/v2", server_metadata, methods=["GET"]),
    Route("/v2/models/stats", statistics, methods=["GET"]),
    *(
        Route(base + suffix, endpoint, methods=["GET"])
        for base in (_MODEL, _VERSION)
        for suffix, endpoint in (
            ("", model),
            ("/ready", model_ready),
            ("/config", config),
            ("/stats", statistics),
        )
    ),
    Route("/v2/repository/index", repository_index, methods=["POST"]),
    Route("/v2/repository/models/{name}/load", repository_load, methods=["POST"]),
    Route("/v2/repository/models/{name}/unload", repository_unload, methods=["POST"]),
]
