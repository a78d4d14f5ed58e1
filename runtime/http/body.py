"""Reading request bodies within a size limit."""

from __future__ import annotations

from starlette.requests import Request

from fnrt.functions.errors import BadRequest, PayloadTooLarge


async def read_body(request: Request, limit_bytes: int) -> bytes:
    """The whole body, refused with PayloadTooLarge as soon as it passes the limit."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BadRequest(f"Content-Length {declared!r} is not a number") from None
        if size > limit_bytes:
            raise PayloadTooLarge(limit_bytes)
        return await request.body()
    chunks = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit_bytes:
            raise PayloadTooLarge(limit_bytes)
        chunks.append(chunk)
    return b"".join(chunks)
