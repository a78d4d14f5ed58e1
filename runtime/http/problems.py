"""Errors to HTTP responses: the one place that maps FnrtError types to statuses."""

from __future__ import annotations

import logging
import math

from starlette.requests import Request
from starlette.responses import Response

from fnrt.functions import errors as e
from fnrt.functions.codec import Format, encode, format_of, negotiate
from fnrt.runtime.scheduler import new_error_id

log = logging.getLogger("fnrt.http")

_STATUS: list[tuple[type[e.FnrtError], int]] = [
    (e.BadRequest, 400),
    (e.IntegrityError, 400),
    (e.Unauthorized, 401),
    (e.NotFound, 404),
    (e.Conflict, 409),
    (e.PayloadTooLarge, 413),
    (e.UnsupportedMediaType, 415),
    (e.ManifestError, 422),
    (e.HandlerError, 422),
    (e.InvalidInput, 422),
    (e.Overloaded, 429),
    (e.LoadError, 500),
    (e.HandlerFailed, 500),
    (e.Unavailable, 503),
    (e.StoreError, 503),
    (e.DeadlineExceeded, 504),
]


def status_of(error: e.FnrtError) -> int:
    for cls, status in _STATUS:
        if isinstance(error, cls):
            return status
    return 400


def _reply_format(request: Request) -> Format:
    """Answer errors in the format the client speaks; JSON when that is unclear."""
    try:
        return negotiate(
            request.headers.get("accept"), format_of(request.headers.get("content-type"))
        )
    except e.FnrtError:
        return Format.JSON


def error_response(request: Request, error: e.FnrtError) -> Response:
    fmt = _reply_format(request)
    headers = {}
    if isinstance(error, e.Overloaded):
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
    if isinstance(error, e.Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    return Response(
        encode(error.to_dict(), fmt),
        status_code=status_of(error),
        media_type=fmt.media_type,
        headers=headers,
    )


async def fnrt_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, e.FnrtError)
    return error_response(request, exc)


async def unexpected_error_handler(request: Request, exc: Exception) -> Response:
    error_id = new_error_id()
    log.error(
        "unhandled error on %s %s (error id %s)",
        request.method,
        request.url.path,
        error_id,
        exc_info=exc,
    )
    fmt = _reply_format(request)
    body = encode({"error": "internal server error", "error_id": error_id}, fmt)
    return Response(body, status_code=500, media_type=fmt.media_type)
