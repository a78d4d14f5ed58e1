"""Split inference over HTTP (docs/edge.md).

- ``GET  /v1/functions/{name}/split``: the plan data (points, heads, server time)
- ``GET  /v1/functions/{name}/split/{k}/head``: the head model for split ``k`` (ONNX)
- ``POST /v1/functions/{name}/split/{k}``: an activation in, the outputs back
- ``POST /v1/probe``: a body the server drops (the device times it: bandwidth)

The POST is a data path, served as raw ASGI like invokes. ``X-Fnrt-Version``
pins the version the device's head came from (a version that is gone is a
404, and the device fetches the plan again); ``X-Fnrt-Server-Ms`` on the
answer is the time spent here, so the device can tell network from compute.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from fnrt.edge.activation import unpack
from fnrt.functions.codec import Format, encode, format_of, negotiate
from fnrt.functions.errors import BadRequest, UnsupportedMediaType
from fnrt.functions.headers import DIGEST_HEADER, SERVER_MS_HEADER, VERSION_HEADER
from fnrt.runtime.gateway import ACTIVATION, Decoded, Target
from fnrt.runtime.http.body import Receive, client_of, read_body
from fnrt.runtime.http.invoke import (
    Answer,
    Scope,
    Send,
    header_map,
    request_options,
    serve_raw,
    served_headers,
)
from fnrt.runtime.http.observe import Trail, begin, end
from fnrt.runtime.http.resource import resource
from fnrt.runtime.http.state import Node, node_of

SPLIT_PATH = re.compile(r"/v1/functions/([^/]+)/split/([^/]+)")
ROUTE = "/v1/functions/{name}/split/{k}"


def split_index(text: str) -> int:
    try:
        k = int(text)
    except ValueError:
        raise BadRequest(f"split {text!r} is not an integer") from None
    if k < 0:
        raise BadRequest(f"split {k} is negative")
    return k


async def _answer(
    node: Node, name: str, k: int, headers: Mapping[str, str], receive: Receive, trail: Trail
) -> Answer:
    reply = negotiate(headers.get("accept"), Format.MSGPACK)
    if node.invoke_keys is not None:
        node.invoke_keys.check(name, headers)
    options = request_options(headers, trail.span, client_of(receive))
    settings = node.settings
    body = await read_body(
        headers, receive, settings.max_body_bytes, timeout_s=settings.body_timeout_s
    )
    started = time.perf_counter()  # server time starts with the whole body here: the
    # upload is network time, which the device estimates its bandwidth from
    if format_of(headers.get("content-type"), default=Format.MSGPACK) is not Format.MSGPACK:
        raise UnsupportedMediaType("a split request's body is application/msgpack")
    activation = unpack(body, node.settings.tensor_limits)
    trail.function = name
    target = Target(name, version=headers.get(VERSION_HEADER) or None, split=k)
    answered = await node.gateway.submit(
        target, lambda _: Decoded({ACTIVATION: activation}), options
    )
    served = answered.served
    trail.version = answered.scheduler.version.version
    trail.cold_tier = served.cold_tier
    if trail.span is not None:
        trail.span.set_attribute("fnrt.split", k)
        trail.span.set_attribute("fnrt.split.bytes", len(body))
    out = encode(served.outputs, reply, node.settings.tensor_limits)
    extra = served_headers(answered)
    extra[SERVER_MS_HEADER] = _since_ms(started)
    return out, reply.media_type, extra


async def serve_split(
    node: Node, name: str, k_text: str, scope: Scope, receive: Receive, send: Send
) -> None:
    """Answer one activation on the raw ASGI interface."""
    headers = header_map(scope)
    telemetry = node.telemetry
    trail = begin(telemetry, ROUTE, scope, headers)

    async def answer() -> Answer:
        return await _answer(node, name, split_index(k_text), headers, receive, trail)

    status = await serve_raw(answer(), scope, send, headers, trail.span)
    end(telemetry, trail, status)


async def split_route(scope: Scope, receive: Receive, send: Send) -> None:
    params = scope["path_params"]
    await serve_split(scope["app"].state.node, params["name"], params["k"], scope, receive, send)


async def get_plan(request: Request) -> Response:
    """What an edge device plans with: split points, heads, this node's time per segment."""
    started = time.perf_counter()
    splits = node_of(request).splits
    name = request.path_params["name"]
    plan = await splits.plan(name, request.query_params.get("version"))
    return JSONResponse(plan, headers={SERVER_MS_HEADER: _since_ms(started)})


async def get_head(request: Request) -> Response:
    """The head model (ONNX) the device runs for split ``k``; its sha256 in a header."""
    started = time.perf_counter()
    splits = node_of(request).splits
    name = request.path_params["name"]
    k = split_index(request.path_params["k"])
    version = request.query_params.get("version")
    head = await splits.head(name, k, version)
    headers = {DIGEST_HEADER: f"sha256:{head.digest}", SERVER_MS_HEADER: _since_ms(started)}
    return FileResponse(head.path, media_type="application/octet-stream", headers=headers)


def _since_ms(started: float) -> str:
    return f"{(time.perf_counter() - started) * 1000.0:.3f}"


async def post_probe(request: Request) -> Response:
    """A bandwidth probe: the body is read (within the size limit) and dropped; its
    upload is all network time, so the server's own time is 0."""
    node = node_of(request)
    receive: Receive = request.receive
    await read_body(request.headers, receive, node.settings.max_body_bytes)
    return Response(status_code=204, headers={SERVER_MS_HEADER: "0"})


routes = [
    resource("/v1/probe", post=post_probe),
    resource("/v1/functions/{name}/split", get=get_plan),
    resource("/v1/functions/{name}/split/{k}/head", get=get_head),
]
