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
import re
import struct
from collections.abc import Mapping
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
from fnrt.runtime.gateway import Answered, Decoded, Target
from fnrt.runtime.http.body import ClientGone, Receive, client_of
from fnrt.runtime.http.invoke import (
    CLIENT_GONE,
    Scope,
    Send,
    header_map,
    read_data,
    request_options,
    served_headers,
    whole_result,
)
from fnrt.runtime.http.observe import Trail, begin, end
from fnrt.runtime.http.problems import problem, status_of, unexpected
from fnrt.runtime.http.state import Node
from fnrt.runtime.stream import Ended, Stream
from fnrt.tracing.spans import fail, traceresponse

GENERATE_PATH = re.compile(r"/v1/functions/([^/]+)/generate")
OIP_GENERATE_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/generate(_stream)?")
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
    headers = header_map(scope)
    telemetry = node.telemetry
    trail = begin(telemetry, OIP_ROUTE if oip else ROUTE, scope, headers)
    try:
        status = await _serve(
            node, name, version, headers, scope, receive, send, trail, oip, oip_stream
        )
    except (ClientGone, ClientLeft):
        status = CLIENT_GONE
    end(telemetry, trail, status)


async def _serve(
    node: Node,
    name: str,
    version: str | None,
    headers: Mapping[str, str],
    scope: Scope,
    receive: Receive,
    send: Send,
    trail: Trail,
    oip: bool,
    oip_stream: bool,
) -> int:
    submitted = _submit(node, name, version, headers, receive, trail, oip, oip_stream)
    try:
        answered, wire = await submitted
    except (ClientGone, ClientLeft):
        raise
    except FnrtError as exc:
        return await _send_problem(send, exc, headers, trail.span)
    except Exception as exc:
        fail(trail.span, exc)
        failed = unexpected(scope["method"], scope["path"], exc, headers)
        await _send_whole(send, failed.status, failed.body, failed.media_type, failed.headers, None)
        return failed.status
    served = answered.served
    stream = served.stream
    out_headers = served_headers(answered)
    if stream is None:  # answered whole (a fallback's cached result)
        body = _whole_body(answered, wire, served.outputs, None, node)
        await _send_whole(send, 200, body, wire.fmt.media_type, out_headers, trail.span)
        return 200
    watcher = asyncio.ensure_future(_watch_disconnect(receive, stream))
    try:
        if wire.stream:
            return await _send_stream(send, answered, stream, wire, out_headers, trail)
        return await _send_joined(send, answered, stream, wire, trail, node)
    except FnrtError as exc:  # before anything was sent: an answer like any request's
        return await _send_problem(send, exc, headers, trail.span)
    finally:
        watcher.cancel()
        if not stream.done:
            stream.cancel()


async def _submit(
    node: Node,
    name: str,
    version: str | None,
    headers: Mapping[str, str],
    receive: Receive,
    trail: Trail,
    oip: bool,
    oip_stream: bool,
) -> tuple[Answered, Wire]:
    fmt = format_of(headers.get("content-type"))
    if oip and fmt is not Format.JSON:
        raise UnsupportedMediaType("the generate extension takes JSON bodies")
    if node.invoke_keys is not None:
        node.invoke_keys.check(name, headers)
    options = request_options(headers, trail.span, client_of(receive))
    raw = decode(await read_data(node, headers, receive, fmt), fmt, node.settings.tensor_limits)
    request_id = None
    if oip and "id" in raw:
        request_id = raw.pop("id")
        if not isinstance(request_id, str):
            raise BadRequest("'id' must be a string")
    wires: list[Wire] = []

    def inputs(vm: VersionManifest) -> Decoded:
        trail.function, trail.version = vm.name, vm.version
        config = vm.manifest.generation
        if config is None:
            raise BadRequest(
                f"function '{vm.name}' is not generative (no [generation] section): "
                f"POST /v1/functions/{vm.name}/invoke"
            )
        given, params = split_body(dict(raw), vm.manifest.inputs, flat=oip)
        asked: Asked = parse_parameters(config, params)
        if oip:
            given = _scalars_as_rows(given, vm)
            wires.append(Wire(oip_stream, Format.JSON, True, request_id))
        else:
            wires.append(choose_wire(headers, asked.stream, oip=False))
        return Decoded(coerce_request(vm.manifest.inputs, given), asked=asked)

    target = Target(name, version=version or headers.get(VERSION_HEADER) or None, headers=headers)
    answered = await node.gateway.submit(target, inputs, options)
    trail.function = answered.scheduler.name
    trail.version = answered.scheduler.version.version
    trail.cold_tier = answered.served.cold_tier
    return answered, wires[-1] if wires else Wire(False, fmt, oip)


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
    answered: Answered,
    wire: Wire,
    outputs: Mapping[str, Any],
    ended: Ended | None,
    node: Node,
) -> bytes:
    if wire.oip:
        return encode_json(wire.oip_object(answered.scheduler, outputs))
    body: dict[str, Any] = {"outputs": dict(outputs)}
    if ended is not None:
        body["finish_reason"] = ended.reason
        body["usage"] = ended.usage.to_dict()
    return encode(body, wire.fmt, node.settings.tensor_limits)


def _oip_value(value: Any) -> Any:
    """An output as Triton's generate writes it: a one-element tensor as its element."""
    if isinstance(value, np.ndarray) and value.size == 1:
        element = value.reshape(-1)[0]
        return element.decode("utf-8", "replace") if isinstance(element, bytes) else element
    return value


async def _send_joined(
    send: Send,
    answered: Answered,
    stream: Stream,
    wire: Wire,
    trail: Trail,
    node: Node,
) -> int:
    outputs, headers = await whole_result(answered, stream, trail)
    body = _whole_body(answered, wire, outputs, stream.ended, node)
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
    answered: Answered,
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
    scheduler = answered.scheduler
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
