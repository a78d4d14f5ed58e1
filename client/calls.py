"""What a client sends and how it reads the answer: the part the sync and async clients share.

A :class:`Call` is one request, built by the functions here, sent by either
client (with retries), and read back by :func:`checked` / :func:`result_of`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from fnrt.client.errors import ServerError, Unreachable, error_for
from fnrt.client.result import Result
from fnrt.client.retry import Attempts, retry_after_s
from fnrt.functions.codec import Format, decode, encode
from fnrt.functions.errors import FnrtError
from fnrt.functions.headers import (
    CACHE_HEADER,
    COLD_START_HEADER,
    FALLBACK_HEADER,
    FUNCTION_HEADER,
    PRIORITY_HEADER,
    STICKY_HEADER,
    TIMEOUT_HEADER,
    VERSION_HEADER,
)
from fnrt.functions.limits import UNBOUNDED
from fnrt.functions.records import format_of_name

DEFAULT_URL = "http://127.0.0.1:8000"


Priority = Literal["high", "normal", "low"]


@dataclass(frozen=True)
class Call:
    """One HTTP request; ``idempotent`` says whether sending it twice is harmless."""

    method: str
    path: str
    idempotent: bool
    params: Mapping[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    content: bytes | Iterator[bytes] | None = None
    json: Any = None
    timeout_s: float | None = None  # None: the client's

    def request(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        timeout = httpx.USE_CLIENT_DEFAULT if self.timeout_s is None else self.timeout_s
        return http.build_request(
            self.method,
            self.path,
            params=self.params,
            headers=self.headers,
            content=self.content,
            json=self.json,
            timeout=timeout,
        )


def invoke_call(
    name: str,
    inputs: Mapping[str, Any],
    *,
    priority: Priority | None,
    deadline_s: float | None,
    version: str | None,
    sticky: str | None,
    timeout_s: float | None,
    idempotent: bool,
    fmt: Format,
    headers: Mapping[str, str] | None,
) -> Call:
    """An invoke of ``name``; the deadline defaults to the timeout (an answer nobody
    waits for is not worth computing)."""
    sent = {"content-type": fmt.media_type, "accept": fmt.media_type, **(headers or {})}
    if priority is not None:
        sent[PRIORITY_HEADER] = priority
    if deadline_s is None:
        deadline_s = timeout_s
    if deadline_s is not None:
        if not deadline_s > 0:
            raise ValueError("deadline_s must be > 0 seconds")
        sent[TIMEOUT_HEADER] = f"{deadline_s * 1000:.3f}"
    if version is not None:
        sent[VERSION_HEADER] = version
    if sticky is not None:
        sent[STICKY_HEADER] = sticky
    return Call(
        "POST",
        f"/v1/functions/{name}/invoke",
        idempotent,
        headers=sent,
        content=encode(inputs, fmt, UNBOUNDED),
        timeout_s=timeout_s,
    )


def checked(response: httpx.Response) -> httpx.Response:
    """The response, or the typed error its status and body say."""
    if response.status_code < 400:
        return response
    raise error_of(response)


def error_of(response: httpx.Response) -> ServerError:
    try:
        body = body_of(response)
    except FnrtError:
        body = {}
    if not isinstance(body, Mapping):
        body = {}
    if "error" not in body and response.text:
        body = {"error": response.text[:500]}
    wait = retry_after_s(response.headers.get("retry-after"))
    return error_for(response.status_code, body, response.reason_phrase, wait)


def body_of(response: httpx.Response) -> Any:
    """A JSON or msgpack answer, decoded (numpy arrays for msgpack tensors)."""
    content_type = response.headers.get("content-type", "")
    fmt = Format.MSGPACK if "msgpack" in content_type else Format.JSON
    return decode(response.content, fmt, UNBOUNDED)


def result_of(response: httpx.Response) -> Result:
    headers = response.headers
    return Result(
        outputs=dict(body_of(response)),
        function=headers.get(FUNCTION_HEADER, ""),
        version=headers.get(VERSION_HEADER, ""),
        cold_start=headers.get(COLD_START_HEADER),
        cache_hit=headers.get(CACHE_HEADER) == "hit",
        fallback=headers.get(FALLBACK_HEADER),
        headers=dict(headers),
    )


def settle(
    attempts: Attempts, url: str, sent: httpx.Response | httpx.TransportError
) -> httpx.Response | float:
    """After one try: the answer to return, or how long to wait before the next try.

    Raises the typed error of a final error answer, or Unreachable.
    """
    if isinstance(sent, httpx.TransportError):
        wait = attempts.after_no_connection() if isinstance(sent, httpx.ConnectError) else None
        if wait is None:
            raise unreachable(url, sent) from None
        return wait
    header = sent.headers.get("retry-after")
    wait = attempts.after_status(sent.status_code, retry_after_s(header))
    return checked(sent) if wait is None else wait


def unreachable(url: str, exc: httpx.TransportError) -> Unreachable:
    """The error for a call that got no answer (``exc`` says why)."""
    if isinstance(exc, httpx.ConnectError):
        return Unreachable(f"cannot reach the fnrt server at {url}: {exc}")
    return Unreachable(f"no answer from the fnrt server at {url}: {exc!r}")


#: Functions per page of a listing (the server's default; it takes up to 1000).
LIST_PAGE = 100


def list_call(limit: int, cursor: str | None) -> Call:
    """One page of ``GET /v1/functions``: ``limit`` functions after ``cursor``."""
    params: dict[str, Any] = {"limit": limit}
    if cursor:
        params["cursor"] = cursor
    return Call("GET", "/v1/functions", True, params=params)


def record_media(name: str) -> str:
    """The media type of a record file, by its suffix; FnrtError for another suffix."""
    return format_of_name(name).media_type


def job_options(
    chunk_records: int | None, webhook: str | None, version: str | None
) -> dict[str, Any]:
    """A submit's options, as query parameters or body fields."""
    found = {"chunk_records": chunk_records, "webhook": webhook, "version": version}
    return {k: v for k, v in found.items() if v is not None}


#: A generate stream of msgpack frames (``Accept``), and msgpack bodies.
FRAMES = "application/vnd.fnrt.frames+msgpack"
MSGPACK = "application/msgpack"


@dataclass(frozen=True)
class Event:
    """One event of a generate stream: ``chunk`` (its outputs), ``done`` (finish reason
    and usage) or ``error`` (the error body, with its status)."""

    kind: str
    data: dict[str, Any]


def read_frames(pieces: Iterator[bytes]) -> Iterator[Event]:
    """The events of a frames stream: each a 4-byte big-endian length, then msgpack."""
    buffer = b""
    for piece in pieces:
        buffer += piece
        while len(buffer) >= 4:
            size = int.from_bytes(buffer[:4], "big")
            if len(buffer) < 4 + size:
                break
            frame = decode(buffer[4 : 4 + size], Format.MSGPACK, UNBOUNDED)
            buffer = buffer[4 + size :]
            yield Event(str(frame["event"]), dict(frame["data"]))
