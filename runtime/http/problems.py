"""Errors to HTTP responses: the one place that maps FnrtError types to statuses."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from fnrt.functions import errors as e
from fnrt.functions.codec import Format, encode, format_of, negotiate
from fnrt.runtime.pool import new_error_id

log = logging.getLogger("fnrt.http")

_STATUS: list[tuple[type[e.FnrtError], int]] = [
    (e.BadOutput, 500),
    (e.BadRequest, 400),
    (e.IntegrityError, 400),
    (e.Unauthorized, 401),
    (e.BodyTimeout, 408),
    (e.NotFound, 404),
    (e.Conflict, 409),
    (e.PayloadTooLarge, 413),
    (e.TensorTooLarge, 413),
    (e.ResponseTooLarge, 413),
    (e.UnsupportedMediaType, 415),
    (e.ManifestError, 422),
    (e.HandlerError, 422),
    (e.DeployRejected, 422),
    (e.EnvironmentFailed, 422),
    (e.InvalidInput, 422),
    (e.Overloaded, 429),
    (e.ClientLeft, 499),
    (e.HandlerTimeout, 504),
    (e.LoadError, 500),
    (e.CorruptBlob, 500),
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


@dataclass(frozen=True)
class Problem:
    """An error response: status, encoded body, media type and extra headers."""

    status: int
    body: bytes
    media_type: str
    headers: dict[str, str]

    def response(self) -> Response:
        return Response(self.body, self.status, self.headers, self.media_type)


def reply_format(headers: Mapping[str, str]) -> Format:
    """Answer errors in the format the client speaks; JSON when that is unclear."""
    try:
        return negotiate(headers.get("accept"), format_of(headers.get("content-type")))
    except e.FnrtError:
        return Format.JSON


def problem(error: e.FnrtError, request_headers: Mapping[str, str]) -> Problem:
    fmt = reply_format(request_headers)
    headers = {}
    if isinstance(error, e.Overloaded | e.CircuitOpen):
        headers["retry-after"] = str(max(1, math.ceil(error.retry_after_s)))
    if isinstance(error, e.Unauthorized):
        headers["www-authenticate"] = "Bearer"
    return Problem(status_of(error), encode(error.to_dict(), fmt), fmt.media_type, headers)


def unexpected(
    method: str, path: str, exc: BaseException, request_headers: Mapping[str, str]
) -> Problem:
    """A 500 for a bug: the traceback is logged under an error id the client gets."""
    error_id = new_error_id()
    log.error("unhandled error on %s %s (error id %s)", method, path, error_id, exc_info=exc)
    fmt = reply_format(request_headers)
    body = encode({"error": "internal server error", "error_id": error_id}, fmt)
    return Problem(500, body, fmt.media_type, {})


async def fnrt_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, e.FnrtError)
    return problem(exc, request.headers).response()


async def http_error_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (no such route: 404; a method the route lacks: 405 with
    ``Allow``) in fnrt's error shape."""
    assert isinstance(exc, HTTPException)
    fmt = reply_format(request.headers)
    body = {"error": f"{exc.detail}: {request.method} {request.url.path}"}
    return Response(encode(body, fmt), exc.status_code, exc.headers, fmt.media_type)


async def unexpected_error_handler(request: Request, exc: Exception) -> Response:
    return unexpected(request.method, request.url.path, exc, request.headers).response()
