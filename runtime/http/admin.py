"""Admin API: upload blobs, deploy, list, describe, warm and delete functions;
versions, traffic splits, rollback and the failed requests kept for analysis.

Guarded by a bearer token when the server has one (``--admin-token``).
"""

from __future__ import annotations

import asyncio
import hmac
import os
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fnrt.functions.codec import Format, encode, negotiate
from fnrt.functions.errors import BadRequest, FnrtError, Unauthorized
from fnrt.functions.manifest import NAME_PATTERN, ROLLOUT_POLICIES
from fnrt.functions.version import VersionManifest, check_digest
from fnrt.loader.integrity import Fingerprinting
from fnrt.runtime import scheduler as sched
from fnrt.runtime import views
from fnrt.runtime.http.body import read_body
from fnrt.runtime.http.resource import Endpoint, resource
from fnrt.runtime.http.state import node_of

_SPOOL_BYTES = 8 * 1024 * 1024
MAX_MANIFEST_BYTES = 4 * 1024 * 1024


def admin(endpoint: Endpoint) -> Endpoint:
    """Require ``Authorization: Bearer <token>`` when the server has a token."""

    async def guarded(request: Request) -> Response:
        token = node_of(request).settings.admin_token
        if token is not None:
            given = request.headers.get("authorization", "")
            scheme, _, value = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip(), token):
                raise Unauthorized("admin routes need 'Authorization: Bearer <token>'")
        return await endpoint(request)

    guarded.__name__ = endpoint.__name__
    guarded.__doc__ = endpoint.__doc__
    return guarded


def _digest(request: Request) -> str:
    try:
        return check_digest(request.path_params["digest"])
    except FnrtError:
        raise BadRequest(f"{request.path_params['digest']!r} is not a sha256 hex digest") from None


@admin
async def head_blob(request: Request) -> Response:
    """200 if the store has the blob, 404 if not (clients upload only what is missing)."""
    repository = node_of(request).repository
    found = await asyncio.to_thread(repository.has_blob, _digest(request))
    return Response(status_code=200 if found else 404)


@admin
async def put_blob(request: Request) -> Response:
    """Stream a blob into the store; refused unless it hashes to its digest."""
    node = node_of(request)
    digest = _digest(request)
    repository = node.repository
    if await asyncio.to_thread(repository.has_blob, digest):
        return JSONResponse({"digest": digest, "created": False})
    spool_dir = node.settings.cache_dir / "uploads"
    spool_dir.mkdir(parents=True, exist_ok=True)
    # the pid in the name: a node removes the spools of dead processes at start
    fd, name = tempfile.mkstemp(dir=spool_dir, prefix=f"{digest[:16]}.{os.getpid()}.")
    spool = Path(name)
    hashes = Fingerprinting()  # as it is spooled, off the loop: not read again to check it

    def write(f: BinaryIO, chunks: list[bytes]) -> None:
        f.writelines(chunks)
        for chunk in chunks:
            hashes.update(chunk)

    try:
        with os.fdopen(fd, "wb") as f:
            pending: list[bytes] = []
            held = 0
            async for chunk in request.stream():
                pending.append(chunk)
                held += len(chunk)
                if held >= _SPOOL_BYTES:
                    await asyncio.to_thread(write, f, pending)
                    pending, held = [], 0
            await asyncio.to_thread(write, f, pending)
        found = hashes.result()
        created = await asyncio.to_thread(repository.put_blob, digest, spool, sha256=found.sha256)
        stored = repository.blob_path(digest)
        if created and stored is not None:  # a folder store: its first load here skips a sha256
            await asyncio.to_thread(node.loader.verifier.record, stored, found)
    finally:
        spool.unlink(missing_ok=True)
    return JSONResponse({"digest": digest, "created": created}, status_code=201 if created else 200)


async def _json_body(request: Request, what: str) -> Any:
    """The request's JSON body (up to ``MAX_MANIFEST_BYTES``); BadRequest naming ``what``."""
    body = await read_body(request.headers, request.receive, MAX_MANIFEST_BYTES)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"{what} is not valid JSON: {exc}") from None


@admin
async def deploy(request: Request) -> Response:
    """Publish a version: the body is a version manifest whose blobs are uploaded."""
    data = await _json_body(request, "deploy body")
    if not isinstance(data, dict):
        raise BadRequest("deploy body must be a JSON object")
    policy = request.query_params.get("policy")
    if policy is not None and policy not in ROLLOUT_POLICIES:
        raise BadRequest(f"policy must be one of {list(ROLLOUT_POLICIES)}, got {policy!r}")
    vm = VersionManifest.from_dict(data)
    deployed = await node_of(request).deployer.deploy(vm, policy=policy)
    return JSONResponse(
        {
            "name": deployed.name,
            "version": deployed.version,
            "created": deployed.created,
            "rollout": deployed.rollout,
            "traffic": dict(deployed.routing.traffic),
            "checks": deployed.checks,
        },
        status_code=201 if deployed.created else 200,
    )


@admin
async def versions(request: Request) -> Response:
    """Every stored version with its share of traffic, state and breaker; the rollout."""
    node = node_of(request)
    return JSONResponse(
        await views.versions(node.registry, request.path_params["name"], node.deployer.rollouts)
    )


@admin
async def set_traffic(request: Request) -> Response:
    """Set the split by hand: ``{"traffic": {"v-...": 90, "v-...": 10}}`` (stops a canary)."""
    data = await _json_body(request, "body")
    traffic = data.get("traffic") if isinstance(data, dict) else None
    if (
        not isinstance(traffic, dict)
        or not traffic
        or not all(isinstance(p, int) and not isinstance(p, bool) for p in traffic.values())
        or sum(traffic.values()) != 100
        or any(not 0 <= p <= 100 for p in traffic.values())
    ):
        raise BadRequest(
            'body must be {"traffic": {version: percent, ...}} with integer shares summing to 100'
        )
    routing = await node_of(request).deployer.set_traffic(request.path_params["name"], traffic)
    return JSONResponse({"traffic": dict(routing.traffic), "previous": list(routing.previous)})


@admin
async def rollback(request: Request) -> Response:
    """All traffic back to the version served before the last cut-over."""
    name = request.path_params["name"]
    routing = await node_of(request).deployer.rollback(name)
    return JSONResponse(
        {"name": name, "version": routing.primary, "traffic": dict(routing.traffic)}
    )


@admin
async def failures(request: Request) -> Response:
    """The newest failed requests (error and inputs), per version, newest first, a page
    at a time: ``?limit=`` (default 20, at most 100) from ``?offset=``."""
    fmt = negotiate(request.headers.get("accept"), Format.JSON)
    name = request.path_params["name"]
    limit = query_int(request, "limit", FAILURES_PAGE, 1, FAILURES_PAGE_MAX)
    offset = query_int(request, "offset", 0, 0, 1 << 31)
    kept = await views.failures(
        node_of(request).registry, name, request.query_params.get("version")
    )
    page = kept[offset : offset + limit]
    after = offset + len(page)
    body = {
        "name": name,
        "failures": page,
        "total": len(kept),
        "next_offset": after if after < len(kept) else None,
    }
    return Response(encode(body, fmt), media_type=fmt.media_type)


FAILURES_PAGE, FAILURES_PAGE_MAX = 20, 100


def query_int(request: Request, key: str, default: int, low: int, high: int) -> int:
    text = request.query_params.get(key)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"?{key}={text!r} is not an integer") from None
    if not low <= value <= high:
        raise BadRequest(f"?{key}= must be from {low} to {high}")
    return value


@admin
async def list_functions(request: Request) -> Response:
    """Deployed functions a page at a time: ``?limit=`` (default 100, at most 1000) after
    ``?cursor=`` (the last page's ``next_cursor``; null on the last page)."""
    limit = query_int(request, "limit", LIST_PAGE, 1, LIST_PAGE_MAX)
    cursor = request.query_params.get("cursor")
    if cursor is not None and not NAME_PATTERN.match(cursor):
        raise BadRequest(f"?cursor={cursor!r} is not a function name (use next_cursor)")
    functions, after = await views.summaries(node_of(request).registry, limit, cursor or "")
    return JSONResponse({"functions": functions, "next_cursor": after})


LIST_PAGE, LIST_PAGE_MAX = 100, 1000


@admin
async def describe(request: Request) -> Response:
    node = node_of(request)
    return JSONResponse(
        await views.describe(node.registry, request.path_params["name"], node.deployer.rollouts)
    )


@admin
async def delete(request: Request) -> Response:
    name = request.path_params["name"]
    await node_of(request).deployer.delete(name)  # its canary stops
    return JSONResponse({"name": name, "deleted": True})


@admin
async def warm(request: Request) -> Response:
    """Load the function's instance now instead of at the first invoke."""
    scheduler = await node_of(request).registry.get(request.path_params["name"])
    await sched.warm(scheduler)
    return JSONResponse(
        {
            "name": scheduler.name,
            "version": scheduler.version.version,
            "state": scheduler.pool.state.value,
        }
    )


@admin
async def unload(request: Request) -> Response:
    """Scale the function to zero now; its files stay in the disk cache. A batch still
    running after ``?wait_s=`` (default 10) is stopped: its requests get 503 and its
    instance is abandoned (a handler that never returns cannot hold it)."""
    node = node_of(request)
    wait_s = query_int(request, "wait_s", UNLOAD_WAIT_S, 0, 3600)
    scheduler = await node.registry.get(request.path_params["name"])
    unloaded, stopped = await sched.unload(scheduler, wait_s)
    body = {
        "name": scheduler.name,
        "unloaded": unloaded,
        "stopped_batches": stopped,
        "state": scheduler.pool.state.value,
    }
    return JSONResponse(body)


UNLOAD_WAIT_S = 10


routes = [
    resource("/v1/blobs/{digest}", head=head_blob, put=put_blob),
    resource("/v1/functions", get=list_functions, post=deploy),
    resource("/v1/functions/{name}", get=describe, delete=delete),
    resource("/v1/functions/{name}/warm", post=warm),
    resource("/v1/functions/{name}/unload", post=unload),
    resource("/v1/functions/{name}/versions", get=versions),
    resource("/v1/functions/{name}/traffic", put=set_traffic),
    resource("/v1/functions/{name}/rollback", post=rollback),
    resource("/v1/functions/{name}/failures", get=failures),
]
