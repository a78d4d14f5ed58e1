"""``POST /v1/functions/{name}/generate`` and OIP's generate extension: a generative
function's answer, streamed chunk by chunk or whole (docs/generation.md).

The body is the request's inputs, as for an invoke, plus an optional
``parameters`` map (``max_new_tokens``, ``stream``, and what the function
declares). The answer streams when ``parameters.stream`` is true or the
``Accept`` header asks for a stream:

- ``text/event-stream`` (JSON clients): Server-Sent Events ``chunk`` (the
  step's outputs), then ``done`` (``finish_reason`` and ``usage``), or
  ``error`` (the error body, with its ``status``) if it fails mid-way;
- ``application/vnd.fnrt.frames+msgpack`` (msgpack clients): the same events
  as frames, each a 4-byte big-endian length and a msgpack map
  ``{"event": ..., "data": ...}``.

Nothing is sent until the first chunk, so a request refused or failed before
it (429, 422, 504 in the queue, a load that fails) gets its status and error
body as any request does. Without streaming the answer is the whole result:
``{"outputs": ..., "finish_reason": ..., "usage": ...}``, each output's chunks
joined (:func:`~fnrt.functions.generation.join_chunks`). A client that
disconnects cancels its sequence at the next step.

Triton's generate extension (``/v2/models/{m}[/versions/{v}]/generate`` and
``generate_stream``) takes a flat JSON body (inputs by name; other keys and
``parameters`` are parameters) and answers ``{"model_name", "model_version",
output: value}``, as one object or as SSE ``data:`` events.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fnrt.functions.codec import (
    Format,
    decode,
    encode,
    encode_json,
    encode_msgpack,
    format_of,
    negotiate,
)
from fnrt.functions.errors import BadRequest, ClientLeft, FnrtError, UnsupportedMediaType
from fnrt.functions.generation import Asked, parse_parameters
from fnrt.functions.headers import COLD_START_HEADER, VERSION_HEADER
from fnrt.functions.tensors import coerce_request
from fnrt.functions.version import VersionManifest
from fnrt.runtime.gateway import Target
from fnrt.runtime.http.body import ClientGone, Receive
from fnrt.runtime.http.data import (
    CLIENT_GONE,
    Incoming,
    Scope,
    Send,
    Serve,
    answering,
    entry,
    open_request,
    submit_data,
)
from fnrt.runtime.http.invoke import body_limits, served_headers, whole_result
from fnrt.runtime.http.observe import Trail, end
from fnrt.runtime.http.problems import problem, status_of, unexpected
from fnrt.runtime.http.state import Node
from fnrt.runtime.protection import Served
from fnrt.runtime.queue import Call
from fnrt.runtime.scheduler import Scheduler
from fnrt.runtime.stream import Ended, Stream
from fnrt.tracing.spans import fail, traceresponse

ROUTE = "/v1/functions/{name}/generate"
OIP_ROUTE = "/v2/models/{name}/generate"
SSE = "text/event-stream"
OIP_SSE = "text/event-stream; charset=utf-8"  # as Triton's generate_stream answers
FRAMES = "application/vnd.fnrt.frames+msgpack"
_LENGTH = struct.Struct(">I")

Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True)
class Wire:
    """How an answer goes out: streamed or whole, in which format, in which shape."""

    stream: bool
    fmt: Format  # of a whole answer, and of errors
    oip: bool = False  # Triton's generate shapes
    request_id: str | None = None  # Triton's optional "id", echoed in every response

    @property
    def media_type(self) -> str:
        if not self.stream:
            return self.fmt.media_type
        if self.oip:
            return OIP_SSE
        return SSE if self.fmt is Format.JSON else FRAMES

    def oip_object(self, scheduler: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
        """A response object of Triton's generate extension."""
        head: dict[str, Any] = {} if self.request_id is None else {"id": self.request_id}
        return {
            **head,
            "model_name": scheduler.name,
            "model_version": scheduler.version.version,
            **{k: _oip_value(v) for k, v in outputs.items()},
        }


def _wants_stream(accept: str | None) -> Format | None:
    """The stream format an Accept header asks for, if any."""
    if not accept:
        return None
    if SSE in accept:
        return Format.JSON
    if FRAMES in accept:
        return Format.MSGPACK
    return None


def choose_wire(headers: Mapping[str, str], asked_stream: bool | None, *, oip: bool) -> Wire:
    """Streamed when the body says so, else when Accept asks for a stream; the format
    of the request's own (JSON: SSE, msgpack: frames) unless Accept names one."""
    fmt = format_of(headers.get("content-type"))
    accept = headers.get("accept")
    streamed = _wants_stream(accept)
    stream = asked_stream if asked_stream is not None else streamed is not None
    if stream:
        return Wire(True, streamed or fmt, oip)
    if streamed is not None:  # asked for a stream type, and for no stream
        return Wire(False, fmt, oip)
    return Wire(False, negotiate(accept, fmt), oip)


def split_body(raw: dict[str, Any], inputs: Mapping[str, Any], *, flat: bool) -> tuple[
    dict[str, Any], Any
]:  # fmt: skip
    """A body's inputs and its raw ``parameters``. ``flat`` (Triton's generate): keys
    that are not inputs are parameters too."""
    params = raw.pop("parameters", None)
    if not flat:
        return raw, params
    extra = {k: raw.pop(k) for k in [k for k in raw if k not in inputs]}
    if extra:
        if params is not None and not isinstance(params, dict):
            raise BadRequest("'parameters' must be a map")
        params = {**extra, **(params or {})}
    return raw, params


def _scalars_as_rows(raw: Mapping[str, Any], vm: VersionManifest) -> dict[str, Any]:
    """Triton's generate sends one-element inputs as bare scalars: make them rows."""
    out = dict(raw)
    for name, spec in vm.manifest.inputs.items():
        value = out.get(name)
        if value is not None and not isinstance(value, list | np.ndarray) and len(spec.shape) == 1:
            out[name] = [value]
    return out


@dataclass(slots=True)
class GenerateBody:
    """A generate's body, parsed: its map, Triton's ``id``, and the wire chosen for the
    version that answers (once its parameters are checked)."""

    raw: dict[str, Any]
    fmt: Format
    request_id: str | None = None
    wire: Wire | None = None


class Generate:
    """A generate route (fnrt's, or Triton's generate extension, ``oip``): the front half
    of :func:`~fnrt.runtime.http.data.serve_data`; the answer streams (``_serve``)."""

    def __init__(self, *, oip: bool = False, oip_stream: bool = False) -> None:
        self.path = OIP_ROUTE if oip else ROUTE
        self.oip = oip
        self.oip_stream = oip_stream

    def target(self, incoming: Incoming) -> Target:
        params = incoming.params
        name = params[0]
        assert name is not None
        pinned = params[1] if len(params) > 1 else None
        headers = incoming.headers
        return Target(name, version=pinned or headers.get(VERSION_HEADER) or None, headers=headers)

    def limits(self, incoming: Incoming) -> tuple[int, str]:
        content_type = incoming.headers.get("content-type")
        if self.oip:
            fmt = incoming.fmt = _oip_format(content_type)
        else:
            fmt = incoming.fmt = format_of(content_type)
        return body_limits(incoming.node, fmt)

    def parse(self, incoming: Incoming, body: bytes) -> GenerateBody:
        fmt = incoming.fmt
        raw = decode(body, fmt, incoming.node.settings.tensor_limits)
        request_id = None
        if self.oip and "id" in raw:
            request_id = raw.pop("id")
            if not isinstance(request_id, str):
                raise BadRequest("'id' must be a string")
        return GenerateBody(raw, fmt, request_id)

    def decode(self, incoming: Incoming, body: GenerateBody, scheduler: Scheduler) -> Call:
        vm = scheduler.version
        config = vm.manifest.generation
        if config is None:
            raise BadRequest(
                f"function '{vm.name}' is not generative (no [generation] section): "
                f"POST /v1/functions/{vm.name}/invoke"
            )
        given, params = split_body(dict(body.raw), vm.manifest.inputs, flat=self.oip)
        asked: Asked = parse_parameters(config, params)
        if self.oip:
            given = _scalars_as_rows(given, vm)
            body.wire = Wire(self.oip_stream, Format.JSON, True, body.request_id)
        else:
            body.wire = choose_wire(incoming.headers, asked.stream, oip=False)
        return incoming.call(scheduler, coerce_request(vm.manifest.inputs, given), asked=asked)


def generate_route(route: Generate) -> Serve:
    """How the route table serves ``route``."""

    def serve(
        node: Node, params: tuple[str | None, ...], scope: Scope, receive: Receive, send: Send
    ) -> Awaitable[None]:
        return _serve_generate(route, node, params, scope, receive, send)

    return serve


async def _serve_generate(
    route: Generate,
    node: Node,
    params: tuple[str | None, ...],
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    incoming = open_request(node, route, params, scope, receive)
    try:
        status = await _serve(route, incoming, scope, send)
    except (ClientGone, ClientLeft):
        status = CLIENT_GONE
    end(node.telemetry, incoming, status)


GENERATE = entry(ROUTE, generate_route(Generate()))
OIP_GENERATE = tuple(
    entry(
        f"/v2/models/{{name}}{versioned}/{kind}",
        generate_route(Generate(oip=True, oip_stream=kind == "generate_stream")),
    )
    for versioned in ("", "/versions/{version}")
    for kind in ("generate", "generate_stream")
)


async def serve_generate(
    node: Node,
    name: str,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    version: str | None = None,
    oip: bool = False,
    oip_stream: bool = False,
) -> None:
    """Answer one generate request on the raw ASGI interface."""
    route = Generate(oip=oip, oip_stream=oip_stream)
    params = (name,) if version is None else (name, version)
    await _serve_generate(route, node, params, scope, receive, send)


async def _serve(route: Generate, incoming: Incoming, scope: Scope, send: Send) -> int:
    headers = incoming.headers
    trail = incoming
    node = incoming.node
    try:
        body, call, served = await submit_data(route, incoming)
    except (ClientGone, ClientLeft):
        raise
    except FnrtError as exc:
        return await _send_problem(send, exc, headers, trail.span)
    except Exception as exc:
        fail(trail.span, exc)
        failed = unexpected(scope["method"], scope["path"], exc, headers)
        await _send_whole(send, failed.status, failed.body, failed.media_type, failed.headers, None)
        return failed.status
    wire = body.wire or Wire(False, body.fmt, route.oip)
    stream = served.stream
    out_headers = served_headers(call, served)
    if stream is None:  # answered whole (a fallback's cached result)
        whole = _whole_body(call, wire, served.outputs, None, node)
        await _send_whole(send, 200, whole, wire.fmt.media_type, out_headers, trail.span)
        return 200
    watcher = asyncio.ensure_future(_watch_disconnect(incoming.receive, stream))
    try:
        if wire.stream:
            return await _send_stream(send, call, stream, wire, out_headers, trail)
        return await _send_joined(send, call, served, wire, trail, node)
    except FnrtError as exc:  # before anything was sent: an answer like any request's
        return await _send_problem(send, exc, headers, trail.span)
    finally:
        watcher.cancel()
        if not stream.done:
            stream.cancel()


async def _watch_disconnect(receive: Receive, stream: Stream) -> None:
    """Cancel the sequence when the client disconnects (the body is read already)."""
    with contextlib.suppress(Exception):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                stream.cancel()
                return


# --- a whole answer --------------------------------------------------------------------


def _whole_body(
    call: Call,
    wire: Wire,
    outputs: Mapping[str, Any],
    ended: Ended | None,
    node: Node,
) -> bytes:
    if wire.oip:
        return encode_json(wire.oip_object(answering(call), outputs))
    body: dict[str, Any] = {"outputs": dict(outputs)}
    if ended is not None:
        body["finish_reason"] = ended.reason
        body["usage"] = ended.usage.to_dict()
    return encode(body, wire.fmt, node.settings.tensor_limits)


def _oip_format(content_type: str | None) -> Format:
    """Triton's generate extension reads a JSON body whatever its Content-Type says, as
    OIP's infer does and as Triton does (``curl -d`` sends a form's type); only one that
    names msgpack is refused, as that body is not JSON."""
    try:
        fmt = format_of(content_type)
    except UnsupportedMediaType:
        return Format.JSON
    if fmt is not Format.JSON:
        raise UnsupportedMediaType("the generate extension takes JSON bodies")
    return fmt


def _oip_value(value: Any) -> Any:
    """An output as Triton's generate writes it: a one-element tensor as its element."""
    if isinstance(value, np.ndarray) and value.size == 1:
        element = value.reshape(-1)[0]
        return element.decode("utf-8", "replace") if isinstance(element, bytes) else element
    return value


async def _send_joined(
    send: Send,
    call: Call,
    served: Served,
    wire: Wire,
    trail: Trail,
    node: Node,
) -> int:
    outputs, headers = await whole_result(call, served, trail)
    assert served.stream is not None
    body = _whole_body(call, wire, outputs, served.stream.ended, node)
    await _send_whole(send, 200, body, wire.fmt.media_type, headers, trail.span)
    return 200


# --- a streamed answer -----------------------------------------------------------------


def _cold(headers: dict[str, str], stream: Stream) -> None:
    if stream.cold_tier is not None:
        headers[COLD_START_HEADER] = stream.cold_tier


def event(wire: Wire, kind: str, data: Any) -> bytes:
    """One event of a stream, encoded for ``wire``."""
    if wire.fmt is Format.MSGPACK:
        payload = encode_msgpack({"event": kind, "data": data})
        return _LENGTH.pack(len(payload)) + payload
    if wire.oip:  # Triton's generate_stream: data lines only
        return b"data: " + encode_json(data) + b"\n\n"
    return b"event: " + kind.encode() + b"\ndata: " + encode_json(data) + b"\n\n"


async def _send_stream(
    send: Send,
    call: Call,
    stream: Stream,
    wire: Wire,
    headers: dict[str, str],
    trail: Trail,
) -> int:
    first = await stream.next()  # errors before the first chunk answer with their status
    _cold(headers, stream)
    raw: Headers = [
        (b"content-type", wire.media_type.encode()),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),  # nginx: pass each event on at once
    ]
    raw += [(k.encode(), v.encode("latin-1")) for k, v in headers.items()]
    _trace_header(raw, trail.span)
    await send({"type": "http.response.start", "status": 200, "headers": raw})
    scheduler = answering(call)
    try:
        chunk = first
        while chunk is not None:
            data: Any = wire.oip_object(scheduler, chunk) if wire.oip else chunk
            body = event(wire, "chunk", data)
            await send({"type": "http.response.body", "body": body, "more_body": True})
            if stream.cancelled:
                break
            chunk = await stream.next()
    except FnrtError as exc:  # failed mid-way: the status is sent already
        fail(trail.span, exc, server_fault=status_of(exc) >= 500)
        said = {**exc.to_dict(), "status": status_of(exc)}
        await send({"type": "http.response.body", "body": event(wire, "error", said)})
        return status_of(exc)
    if stream.cancelled and not stream.done:
        await send({"type": "http.response.body", "body": b""})
        return CLIENT_GONE
    ended = stream.ended
    tail = b""
    if ended is not None and not wire.oip:
        tail = event(wire, "done", {"finish_reason": ended.reason, "usage": ended.usage.to_dict()})
    await send({"type": "http.response.body", "body": tail})
    return 200


def _trace_header(raw: Headers, span: Any) -> None:
    trace_header = traceresponse(span)
    if trace_header is not None:
        raw.append(trace_header)


async def _send_whole(
    send: Send,
    status: int,
    body: bytes,
    media_type: str,
    headers: Mapping[str, str],
    span: Any,
) -> None:
    raw: Headers = [
        (b"content-type", media_type.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    raw += [(k.encode(), v.encode("latin-1")) for k, v in headers.items()]
    _trace_header(raw, span)
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _send_problem(
    send: Send, exc: FnrtError, request_headers: Mapping[str, str], span: Any
) -> int:
    failed = problem(exc, request_headers)
    fail(span, exc, server_fault=failed.status >= 500)
    await _send_whole(send, failed.status, failed.body, failed.media_type, failed.headers, span)
    return failed.status
