"""``POST /v1/functions/{name}/invoke``: the data path, served as raw ASGI.

Invokes are the hot path, so they skip Starlette's middleware, router and
Request/Response objects (about a third of the event loop's time per request
when they did not): :class:`fnrt.runtime.http.app.FnrtApp` hands matching
requests straight to :func:`serve_invoke`. Errors go through the same
:mod:`fnrt.runtime.http.problems` mapping as every other route.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from fnrt.functions.codec import Format, decode, encode, format_of, negotiate
from fnrt.functions.errors import BadRequest, ClientLeft, FnrtError
from fnrt.functions.generation import join_chunks
from fnrt.functions.headers import (
    CACHE_HEADER,
    COLD_START_HEADER,
    FALLBACK_HEADER,
    FINISH_HEADER,
    FUNCTION_HEADER,
    PRIORITY_HEADER,
    TIMEOUT_HEADER,
    VERSION_HEADER,
)
from fnrt.functions.tensors import coerce_request
from fnrt.functions.version import VersionManifest
from fnrt.runtime.gateway import Answered, Decoded, Options, Target
from fnrt.runtime.http.body import ClientGone, Receive, client_of, read_body
from fnrt.runtime.http.observe import Trail, begin, end
from fnrt.runtime.http.problems import problem, unexpected
from fnrt.runtime.http.state import Node
from fnrt.runtime.queue import Client, Priority
from fnrt.runtime.stream import Stream
from fnrt.tracing.spans import fail, traceresponse

Scope = MutableMapping[str, Any]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

Answer = tuple[bytes, str, dict[str, str]]  # body, media type, extra headers

INVOKE_PATH = re.compile(r"/v1/functions/([^/]+)/invoke")
ROUTE = "/v1/functions/{name}/invoke"
#: What metrics and logs record for a request whose client left before the answer.
CLIENT_GONE = 499
#: What a browser client may read of an answer (CORS ``expose_headers``).
SERVED_HEADERS = (
    VERSION_HEADER,
    FUNCTION_HEADER,
    COLD_START_HEADER,
    CACHE_HEADER,
    FALLBACK_HEADER,
)
#: Why a JSON body has a lower limit than msgpack (orjson parses holding the GIL).
JSON_BODY_HINT = (
    "JSON bodies have a lower limit (--max-json-body-bytes): send large tensors "
    "as application/msgpack"
)


def request_options(
    headers: Mapping[str, str], span: Any = None, client: Client | None = None
) -> Options:
    """Priority and timeout from the request headers; BadRequest if malformed."""
    priority = None
    if PRIORITY_HEADER in headers:
        try:
            priority = Priority.parse(headers[PRIORITY_HEADER])
        except ValueError as exc:
            raise BadRequest(f"{PRIORITY_HEADER}: {exc}") from None
    timeout_s = None
    if TIMEOUT_HEADER in headers:
        text = headers[TIMEOUT_HEADER]
        try:
            timeout_s = float(text) / 1000.0
        except ValueError:
            raise BadRequest(
                f"{TIMEOUT_HEADER}: {text!r} is not a number of milliseconds"
            ) from None
        if not timeout_s > 0:
            raise BadRequest(f"{TIMEOUT_HEADER}: must be > 0")
    return Options(priority, timeout_s, span, client)


def read_data(
    node: Node, headers: Mapping[str, str], receive: Receive, fmt: Format
) -> Awaitable[bytes]:
    """A data request's body, within the limit of its format (JSON's is lower), to
    await (not a coroutine of its own: one frame less on every request)."""
    settings = node.settings
    if fmt is Format.JSON:
        return read_body(
            headers, receive, settings.json_body_limit, JSON_BODY_HINT, settings.body_timeout_s
        )
    return read_body(headers, receive, settings.max_body_bytes, timeout_s=settings.body_timeout_s)


async def _answer(
    node: Node, name: str, headers: Mapping[str, str], receive: Receive, trail: Trail
) -> Answer:
    fmt = format_of(headers.get("content-type"))
    reply = negotiate(headers.get("accept"), fmt)
    if node.invoke_keys is not None:
        node.invoke_keys.check(name, headers)
    options = request_options(headers, trail.span, client_of(receive))
    limits = node.settings.tensor_limits
    decoded = decode(await read_data(node, headers, receive, fmt), fmt, limits)

    def inputs(vm: VersionManifest) -> Decoded:
        trail.function, trail.version = vm.name, vm.version
        return Decoded(coerce_request(vm.manifest.inputs, decoded))

    target = Target(name, version=headers.get(VERSION_HEADER) or None, headers=headers)
    answered = await node.gateway.submit(target, inputs, options)
    served = answered.served
    trail.function, trail.version = answered.scheduler.name, answered.scheduler.version.version
    trail.cold_tier = served.cold_tier
    if served.stream is not None:  # a generative function: its whole result
        outputs, headers_out = await whole_result(answered, served.stream, trail)
        return encode(outputs, reply, limits), reply.media_type, headers_out
    span = trail.span
    if span is None or not span.recording:
        out = encode(served.outputs, reply, limits)
    else:  # its encode span
        started_ns = time.time_ns()
        out = encode(served.outputs, reply, limits)
        span.encoded = (started_ns, time.time_ns(), len(out))
    return out, reply.media_type, served_headers(answered)


async def whole_result(
    answered: Answered, stream: Stream, trail: Trail
) -> tuple[dict[str, Any], dict[str, str]]:
    """A generative function's answer to an invoke or an infer: every chunk, joined
    (with the function's default parameters), and the answer's headers, why it ended
    among them."""
    try:
        chunks = [chunk async for chunk in stream]
    finally:
        if not stream.done:
            stream.cancel()  # the client left while it ran
    assert stream.ended is not None
    outputs = join_chunks(answered.scheduler.version.manifest.outputs, chunks)
    headers = served_headers(answered)
    headers[FINISH_HEADER] = stream.ended.reason
    if stream.cold_tier is not None:
        headers[COLD_START_HEADER] = trail.cold_tier = stream.cold_tier
    return outputs, headers


def served_headers(answered: Answered) -> dict[str, str]:
    """The ``x-fnrt-*`` headers of an answered request: who served it, and how."""
    scheduler, served = answered.scheduler, answered.served
    out = {FUNCTION_HEADER: scheduler.name, VERSION_HEADER: scheduler.version.version}
    if served.cached:
        out[CACHE_HEADER] = "hit"
    if served.fallback is not None:
        out[FALLBACK_HEADER] = served.fallback
    if served.cold_tier is not None:
        out[COLD_START_HEADER] = served.cold_tier
    return out


async def serve_raw(
    answer: Awaitable[Answer],
    scope: Scope,
    send: Send,
    error_headers: Mapping[str, str],
    span: Any = None,
) -> int:
    """Send ``answer``'s response, or the error it raised (formatted for ``error_headers``);
    the status sent (499 when the client left first). Errors are recorded on ``span``."""
    try:
        body, media_type, extra = await answer
        status = 200
    except (ClientGone, ClientLeft):
        return CLIENT_GONE  # nobody to answer
    except FnrtError as exc:
        failed = problem(exc, error_headers)
        fail(span, exc, server_fault=failed.status >= 500)
        status, body, media_type, extra = (
            failed.status,
            failed.body,
            failed.media_type,
            failed.headers,
        )
    except Exception as exc:
        fail(span, exc)
        failed = unexpected(scope["method"], scope["path"], exc, error_headers)
        status, body, media_type, extra = (
            failed.status,
            failed.body,
            failed.media_type,
            failed.headers,
        )
    raw = [(b"content-type", media_type.encode()), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode("latin-1")) for k, v in extra.items()]
    trace_header = traceresponse(span)
    if trace_header is not None:
        raw.append(trace_header)
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
    return status


def header_map(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


async def serve_invoke(node: Node, name: str, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one invoke on the raw ASGI interface."""
    headers = header_map(scope)
    telemetry = node.telemetry
    trail = begin(telemetry, ROUTE, scope, headers)
    status = await serve_raw(
        _answer(node, name, headers, receive, trail), scope, send, headers, trail.span
    )
    end(telemetry, trail, status)
