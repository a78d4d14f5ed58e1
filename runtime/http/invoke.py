"""``POST /v1/functions/{name}/invoke``: the data path, as a :class:`DataRoute` of
:func:`~fnrt.runtime.http.data.serve_data` (the template every data route shares).

The body is msgpack or JSON (``Content-Type``), parsed once; its arrays are
checked against the inputs of the version chosen to answer; the answer is
encoded in the request's format unless ``Accept`` says otherwise. Errors go
through the same :mod:`fnrt.runtime.http.problems` mapping as every other route.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from fnrt.functions.codec import Format, decode, encode, format_of, negotiate
from fnrt.functions.headers import (
    CACHE_HEADER,
    COLD_START_HEADER,
    FALLBACK_HEADER,
    FINISH_HEADER,
    FUNCTION_HEADER,
    VERSION_HEADER,
)
from fnrt.functions.tensors import coerce_request
from fnrt.runtime.gateway import Target
from fnrt.runtime.http.body import Receive
from fnrt.runtime.http.data import (
    CLIENT_GONE,
    Answer,
    Incoming,
    Scope,
    Send,
    answered_by,
    answering,
    data_entry,
    header_map,
    joined,
    request_options,
    serve_raw,
)
from fnrt.runtime.http.observe import Trail
from fnrt.runtime.http.state import Node
from fnrt.runtime.protection import Served
from fnrt.runtime.queue import Call
from fnrt.runtime.scheduler import Scheduler

__all__ = [
    "CLIENT_GONE",
    "INVOKE",
    "INVOKE_PATH",
    "SERVED_HEADERS",
    "Answer",
    "Invoke",
    "Scope",
    "Send",
    "body_limits",
    "header_map",
    "request_options",
    "serve_raw",
    "served_headers",
    "whole_result",
]

ROUTE = "/v1/functions/{name}/invoke"
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


def body_limits(node: Node, fmt: Format) -> tuple[int, str]:
    """The most bytes a data request's body may hold in ``fmt`` (JSON's is lower), and
    what a 413 says to do instead."""
    settings = node.settings
    if fmt is Format.JSON:
        return settings.json_body_limit, JSON_BODY_HINT
    return settings.max_body_bytes, ""


class Invoke:
    """The invoke route: a msgpack or JSON map of arrays in, the same out."""

    path = ROUTE

    def target(self, incoming: Incoming) -> Target:
        name = incoming.params[0]
        assert name is not None
        headers = incoming.headers
        return Target(name, version=headers.get(VERSION_HEADER) or None, headers=headers)

    def limits(self, incoming: Incoming) -> tuple[int, str]:
        headers = incoming.headers
        fmt = incoming.fmt = format_of(headers.get("content-type"))
        incoming.reply = negotiate(headers.get("accept"), fmt)  # 406 before the body is read
        return body_limits(incoming.node, fmt)

    def parse(self, incoming: Incoming, raw: bytes) -> Any:
        return decode(raw, incoming.fmt, incoming.node.settings.tensor_limits)

    def decode(self, incoming: Incoming, body: Any, scheduler: Scheduler) -> Call:
        return incoming.call(scheduler, coerce_request(scheduler.version.manifest.inputs, body))

    def answer(self, incoming: Incoming, body: Any, call: Call, served: Served) -> Answer:
        reply = incoming.reply
        limits = incoming.node.settings.tensor_limits
        span = incoming.span
        if span is None or not span.recording:
            out = encode(served.outputs, reply, limits)
        else:  # its encode span
            started_ns = time.time_ns()
            out = encode(served.outputs, reply, limits)
            span.encoded = (started_ns, time.time_ns(), len(out))
        if (
            served.cold_tier is None
            and not served.cached
            and served.fallback is None
            and served.finish is None
        ):
            scheduler = call.scheduler  # who answered, as usual: its headers encoded once
            media_type = reply.media_type
            return (
                out,
                media_type,
                answered_by(scheduler.name, scheduler.version.version, media_type),
            )
        return out, reply.media_type, served_headers(call, served)

    def error_headers(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        return headers


INVOKE = data_entry(ROUTE, Invoke())
INVOKE_PATH = INVOKE.pattern


async def whole_result(
    call: Call, served: Served, trail: Trail
) -> tuple[dict[str, Any], dict[str, str]]:
    """A generative function's answer, whole (:func:`joined`), and the answer's headers,
    why it ended among them."""
    whole = await joined(call, served, trail)
    return whole.outputs, served_headers(call, whole)


def served_headers(call: Call, served: Served) -> dict[str, str]:
    """The ``x-fnrt-*`` headers of an answered request: who served it, and how."""
    scheduler = answering(call)
    out = {FUNCTION_HEADER: scheduler.name, VERSION_HEADER: scheduler.version.version}
    if served.cached:
        out[CACHE_HEADER] = "hit"
    if served.fallback is not None:
        out[FALLBACK_HEADER] = served.fallback
    if served.cold_tier is not None:
        out[COLD_START_HEADER] = served.cold_tier
    if served.finish is not None:
        out[FINISH_HEADER] = served.finish
    return out


async def serve_invoke(node: Node, name: str, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one invoke on the raw ASGI interface."""
    await INVOKE.serve(node, (name,), scope, receive, send)
