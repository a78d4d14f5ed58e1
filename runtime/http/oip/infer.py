"""``POST /v2/models/{m}[/versions/{v}]/infer``, served as raw ASGI like ``/v1`` invokes.

The request goes through the same scheduler (admission, priority, batching,
result cache) as a ``/v1`` invoke; only the body format differs. tritonclient
sends no Content-Type, so the body's shape is told by
``Inference-Header-Content-Length`` alone. Errors are ``{"error": ...}`` JSON.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fnrt.functions.tensors import coerce_request
from fnrt.runtime.gateway import Target
from fnrt.runtime.http.data import Answer, Incoming, Scope, Send, data_entry
from fnrt.runtime.http.invoke import served_headers
from fnrt.runtime.http.oip.wire import (
    HEADER_LENGTH,
    InferRequest,
    compress,
    decode_request,
    decompress,
    encode_response,
    parse_header_length,
    response_encoding,
)
from fnrt.runtime.http.state import Node
from fnrt.runtime.protection import Served
from fnrt.runtime.queue import Call
from fnrt.runtime.scheduler import Scheduler

#: Both infer paths (with and without a version) in one pattern.
INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
INFER_ROUTE = "/v2/models/{name}/infer"
INFER_VERSION_ROUTE = "/v2/models/{name}/versions/{version}/infer"
_JSON_ERRORS: Mapping[str, str] = {}  # errors on /v2 are always JSON


@dataclass(slots=True)
class InferBody:
    """An infer's body, uncompressed, and the request as the chosen version decoded it."""

    raw: bytes
    length: int | None  # of its JSON part, when binary tensors follow
    request: InferRequest | None = None


class Infer:
    """OIP's infer: JSON tensors, or the binary extension, in and out."""

    def __init__(self, path: str) -> None:
        self.path = path

    def target(self, incoming: Incoming) -> Target:
        name, version = (
            incoming.params[0],
            incoming.params[-1] if len(incoming.params) > 1 else None,
        )
        assert name is not None
        return Target(name, version, headers=incoming.headers)

    def limits(self, incoming: Incoming) -> tuple[int, str]:
        return incoming.node.settings.max_body_bytes, ""

    def parse(self, incoming: Incoming, raw: bytes) -> InferBody:
        headers = incoming.headers
        limit = incoming.node.settings.max_body_bytes
        body = decompress(raw, headers.get("content-encoding"), limit)
        return InferBody(body, parse_header_length(headers.get(HEADER_LENGTH), len(body)))

    def decode(self, incoming: Incoming, body: InferBody, scheduler: Scheduler) -> Call:
        settings = incoming.node.settings
        inputs = scheduler.version.manifest.inputs
        request = decode_request(
            body.raw, body.length, inputs, settings.tensor_limits, settings.json_body_limit
        )
        body.request = request
        checked = coerce_request(inputs, request.inputs)
        return incoming.call(scheduler, checked, request.priority, request.timeout_s)

    def answer(self, incoming: Incoming, body: InferBody, call: Call, served: Served) -> Answer:
        scheduler = call.answered_by or call.scheduler
        assert body.request is not None
        out, json_length = encode_response(
            scheduler.name,
            scheduler.version.version,
            body.request,
            served.outputs,
            scheduler.version.manifest.outputs,
            incoming.node.settings.tensor_limits,
        )
        extra = served_headers(call, served)
        media_type = "application/json"
        if json_length is not None:
            extra[HEADER_LENGTH] = str(json_length)
            media_type = "application/octet-stream"
        coding = response_encoding(incoming.headers.get("accept-encoding"))
        if coding is not None:
            out = compress(out, coding)
            extra["content-encoding"] = coding
        return out, media_type, extra

    def error_headers(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        return _JSON_ERRORS


INFER = data_entry(INFER_ROUTE, Infer(INFER_ROUTE))
INFER_VERSION = data_entry(INFER_VERSION_ROUTE, Infer(INFER_VERSION_ROUTE))


async def serve_infer(
    node: Node, name: str, version: str | None, scope: Scope, receive: Any, send: Send
) -> None:
    """Answer one infer request on the raw ASGI interface."""
    if version is None:
        await INFER.serve(node, (name,), scope, receive, send)
    else:
        await INFER_VERSION.serve(node, (name, version), scope, receive, send)
