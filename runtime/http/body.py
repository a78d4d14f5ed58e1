"""Reading request bodies within a size limit, on the raw ASGI interface."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from fnrt.functions.errors import BadRequest, BodyTimeout, PayloadTooLarge
from fnrt.runtime.queue import Client

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class ClientGone(Exception):
    """The client disconnected before its body arrived."""


def client_of(receive: Receive) -> Client | None:
    """The request's connection where the server tells, without a read, whether the
    client left (uvicorn's request cycle keeps a ``disconnected`` flag); None elsewhere.
    The batcher looks at it before computing a queued request."""
    cycle = getattr(receive, "__self__", None)
    return cycle if hasattr(cycle, "disconnected") else None


def within(body: bytes, limit_bytes: int, hint: str = "") -> bytes:
    """``body``, all of it here, refused with PayloadTooLarge (saying ``hint``) past the
    limit."""
    if len(body) > limit_bytes:
        raise PayloadTooLarge(limit_bytes, hint)
    return body


async def read_body(
    headers: Mapping[str, str],
    receive: Receive,
    limit_bytes: int,
    hint: str = "",
    timeout_s: float | None = None,
) -> bytes:
    """The whole body, refused with PayloadTooLarge (saying ``hint``) as soon as it
    passes the limit, and with BodyTimeout (408) when it stalls for ``timeout_s``
    between reads, or when the connection cut it off for arriving under the minimum
    rate (BodyTooSlow; the connection answered it). The first read waits on no timer:
    a small body is there whole."""
    take = getattr(getattr(receive, "__self__", None), "whole_body", None)
    if take is not None and (whole := take()) is not None:  # connection.Answering: all here
        return within(whole, limit_bytes, hint)
    declared = headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit_bytes:
                raise PayloadTooLarge(limit_bytes, hint)
        except ValueError:
            raise BadRequest(f"Content-Length {declared!r} is not a number") from None
    chunks: list[bytes] = []
    received = 0
    message = await receive()
    while True:
        if message["type"] == "http.disconnect":
            # the connection refused a body too slow (connection.py) and said why: 408
            refused = getattr(getattr(receive, "__self__", None), "refused", None)
            if isinstance(refused, BodyTimeout):
                raise refused
            raise ClientGone
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > limit_bytes:
            raise PayloadTooLarge(limit_bytes, hint)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if timeout_s is None:
            message = await receive()
            continue
        try:
            async with asyncio.timeout(timeout_s):
                message = await receive()
        except TimeoutError:
            raise BodyTimeout(timeout_s) from None
