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

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from fnrt.edge.activation import unpack
from fnrt.functions.codec import Format, encode, format_of, negotiate
from fnrt.functions.errors import BadRequest, UnsupportedMediaType
from fnrt.functions.headers import DIGEST_HEADER, SERVER_MS_HEADER, VERSION_HEADER
from fnrt.runtime.access import require_key
from fnrt.runtime.gateway import ACTIVATION, Target
from fnrt.runtime.http.body import Receive, read_body
from fnrt.runtime.http.data import Answer, Incoming, Scope, Send, data_entry
from fnrt.runtime.http.invoke import served_headers
from fnrt.runtime.http.resource import resource
from fnrt.runtime.http.state import Node, node_of
from fnrt.runtime.protection import Served
from fnrt.runtime.queue import Call
from fnrt.runtime.scheduler import Scheduler

ROUTE = "/v1/functions/{name}/split/{k}"


def split_index(text: str) -> int:
    try:
        k = int(text)
    except ValueError:
        raise BadRequest(f"split {text!r} is not an integer") from None
    if k < 0:
        raise BadRequest(f"split {k} is negative")
    return k


@dataclass(slots=True)
class Activation:
    """A split request's body: the activation, when its server time began, its size."""

    array: Any
    started: float  # perf_counter when the whole body was here (the upload is network time)
    size: int


class SplitTail:
    """A split tail: an edge device's activation in (msgpack), the outputs back."""

    path = ROUTE

    def target(self, incoming: Incoming) -> Target:
        name, k_text = incoming.params
        assert name is not None and k_text is not None
        version = incoming.headers.get(VERSION_HEADER) or None
        return Target(name, version=version, split=split_index(k_text))

    def limits(self, incoming: Incoming) -> tuple[int, str]:
        incoming.reply = negotiate(incoming.headers.get("accept"), Format.MSGPACK)
        return incoming.node.settings.max_body_bytes, ""

    def parse(self, incoming: Incoming, body: bytes) -> Activation:
        headers = incoming.headers
        settings = incoming.node.settings
        started = time.perf_counter()  # server time starts with the whole body here: the
        # upload is network time, which the device estimates its bandwidth from
        if format_of(headers.get("content-type"), default=Format.MSGPACK) is not Format.MSGPACK:
            raise UnsupportedMediaType("a split request's body is application/msgpack")
        return Activation(unpack(body, settings.tensor_limits), started, len(body))

    def decode(self, incoming: Incoming, body: Activation, scheduler: Scheduler) -> Call:
        k = split_index(incoming.params[1] or "")
        return incoming.call(scheduler, {ACTIVATION: body.array}, split=k)

    def answer(self, incoming: Incoming, body: Activation, call: Call, served: Served) -> Answer:
        span = incoming.span
        if span is not None:
            span.set_attribute("fnrt.split", call.split)
            span.set_attribute("fnrt.split.bytes", body.size)
        out = encode(served.outputs, incoming.reply, incoming.node.settings.tensor_limits)
        extra = served_headers(call, served)
        extra[SERVER_MS_HEADER] = _since_ms(body.started)
        return out, incoming.reply.media_type, extra

    def error_headers(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        return headers


SPLIT = data_entry(ROUTE, SplitTail())
SPLIT_PATH = SPLIT.pattern


async def serve_split(
    node: Node, name: str, k_text: str, scope: Scope, receive: Receive, send: Send
) -> None:
    """Answer one activation on the raw ASGI interface."""
    await SPLIT.serve(node, (name, k_text), scope, receive, send)


async def get_plan(request: Request) -> Response:
    """What an edge device plans with: split points, heads, this node's time per segment."""
    started = time.perf_counter()
    node = node_of(request)
    name = request.path_params["name"]
    require_key(node.invoke_keys, name, request.headers)
    plan = await node.splits.plan(name, request.query_params.get("version"))
    return JSONResponse(plan, headers={SERVER_MS_HEADER: _since_ms(started)})


async def get_head(request: Request) -> Response:
    """The head model (ONNX) the device runs for split ``k``; its sha256 in a header."""
    started = time.perf_counter()
    node = node_of(request)
    name = request.path_params["name"]
    # a head is the model's first layers (n + 1: all): keyed as the tails are
    require_key(node.invoke_keys, name, request.headers)
    k = split_index(request.path_params["k"])
    version = request.query_params.get("version")
    head = await node.splits.head(name, k, version)
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
