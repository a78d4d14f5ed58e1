"""``POST /v2/models/{m}[/versions/{v}]/infer``, served as raw ASGI like ``/v1`` invokes.

The request goes through the same scheduler (admission, priority, batching,
result cache) as a ``/v1`` invoke; only the body format differs. tritonclient
sends no Content-Type, so the body's shape is told by
``Inference-Header-Content-Length`` alone. Errors are ``{"error": ...}`` JSON.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from fnrt.functions.tensors import coerce_request
from fnrt.functions.version import VersionManifest
from fnrt.runtime.gateway import Decoded, Target
from fnrt.runtime.http.body import Receive, client_of, read_body
from fnrt.runtime.http.invoke import (
    Answer,
    Scope,
    Send,
    header_map,
    request_options,
    serve_raw,
    served_headers,
    whole_result,
)
from fnrt.runtime.http.observe import Trail, begin, end
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

INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
INFER_ROUTE = "/v2/models/{name}/infer"
INFER_VERSION_ROUTE = "/v2/models/{name}/versions/{version}/infer"
_JSON_ERRORS: Mapping[str, str] = {}  # errors on /v2 are always JSON


async def _answer(
    node: Node,
    name: str,
    version: str | None,
    headers: Mapping[str, str],
    receive: Receive,
    trail: Trail,
) -> Answer:
    if node.invoke_keys is not None:
        node.invoke_keys.check(name, headers)
    options = request_options(headers, trail.span, client_of(receive))
    settings = node.settings
    limit, limits, json_limit = (
        settings.max_body_bytes,
        settings.tensor_limits,
        settings.json_body_limit,  # the JSON part's (all of a body without binary data)
    )
    body = decompress(
        await read_body(headers, receive, limit, timeout_s=settings.body_timeout_s),
        headers.get("content-encoding"),
        limit,
    )
    length = parse_header_length(headers.get(HEADER_LENGTH), len(body))
    decoded: list[InferRequest] = []  # the request as the chosen version decoded it

    def inputs(vm: VersionManifest) -> Decoded:
        trail.function, trail.version = vm.name, vm.version
        request = decode_request(body, length, vm.manifest.inputs, limits, json_limit)
        decoded.append(request)
        checked = coerce_request(vm.manifest.inputs, request.inputs)
        return Decoded(checked, request.priority, request.timeout_s)

    answered = await node.gateway.submit(Target(name, version, headers=headers), inputs, options)
    scheduler, served = answered.scheduler, answered.served
    trail.function, trail.version = scheduler.name, scheduler.version.version
    trail.cold_tier = served.cold_tier
    request = decoded[-1]
    outputs, extra = served.outputs, None
    if served.stream is not None:  # a generative function: its whole result
        outputs, extra = await whole_result(answered, served.stream, trail)
    out, json_length = encode_response(
        scheduler.name,
        scheduler.version.version,
        request,
        outputs,
        scheduler.version.manifest.outputs,
        limits,
    )
    extra = extra or served_headers(answered)
    media_type = "application/json"
    if json_length is not None:
        extra[HEADER_LENGTH] = str(json_length)
        media_type = "application/octet-stream"
    coding = response_encoding(headers.get("accept-encoding"))
    if coding is not None:
        out = compress(out, coding)
        extra["content-encoding"] = coding
    return out, media_type, extra


async def serve_infer(
    node: Node, name: str, version: str | None, scope: Scope, receive: Receive, send: Send
) -> None:
    """Answer one infer request on the raw ASGI interface."""
    headers = header_map(scope)
    telemetry = node.telemetry
    route = INFER_ROUTE if version is None else INFER_VERSION_ROUTE
    trail = begin(telemetry, route, scope, headers)
    answer = _answer(node, name, version, headers, receive, trail)
    status = await serve_raw(answer, scope, send, _JSON_ERRORS, trail.span)
    end(telemetry, trail, status)
