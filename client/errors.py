"""What a call to an fnrt server can raise: one class per kind of answer.

Every class is an :class:`fnrt.functions.errors.FnrtError` (the project's one
error hierarchy) and carries the server's own words: ``message`` is its
``error``, ``status`` the HTTP status, ``error_id`` the id its logs carry
(quote it in a bug report), ``cause`` its one-word cause where it gave one,
``retry_after_s`` its ``Retry-After`` on a 429 or 503.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fnrt.functions.errors import FnrtError


class Unreachable(FnrtError):
    """No answer at all: the server could not be reached, or the call timed out."""


class ServerError(FnrtError):
    """The server answered with an error status (the base of the classes below)."""

    def __init__(
        self, status: int, message: str, retry_after_s: float | None = None, **fields: Any
    ) -> None:
        super().__init__(message, status=status, **fields)
        self.status = status
        self.retry_after_s = retry_after_s
        self.error_id: str | None = fields.get("error_id")
        self.cause: str | None = fields.get("cause")

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"


class BadRequestError(ServerError):
    """400 (or 408, 415): the request could not be read: malformed body, bad header."""


class UnauthorizedError(ServerError):
    """401: the call needs ``token=`` (an admin token, or the function's invoke key)."""


class NotFoundError(ServerError):
    """404: no such function, version, split or blob."""


class ConflictError(ServerError):
    """409: a concurrent change won (routing changed since it was read)."""


class PayloadTooLargeError(ServerError):
    """413: the request, a tensor in it, or the answer is past the server's limits."""


class InvalidInputError(ServerError):
    """422: the inputs do not match the function's declared inputs, or a deploy was refused."""


class OverloadedError(ServerError):
    """429: the function's queue is full; retried by the client, then raised."""


class HandlerFailedError(ServerError):
    """500: the handler raised, crashed or failed to load."""


class UnavailableError(ServerError):
    """503: the function cannot serve now (draining, circuit open, store down)."""


class DeadlineError(ServerError):
    """504: the deadline passed before an answer (queued too long, or the handler's timeout)."""


_BY_STATUS: dict[int, type[ServerError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: UnauthorizedError,
    404: NotFoundError,
    408: BadRequestError,
    409: ConflictError,
    413: PayloadTooLargeError,
    415: BadRequestError,
    422: InvalidInputError,
    429: OverloadedError,
    500: HandlerFailedError,
    503: UnavailableError,
    504: DeadlineError,
}


def error_for(
    status: int, body: Mapping[str, Any], reason: str, retry_after_s: float | None
) -> ServerError:
    """The error for an answer with ``status`` and the decoded ``body`` (``{}`` if none)."""
    kind = _BY_STATUS.get(status, ServerError)
    message = str(body.get("error") or reason or f"HTTP {status}")
    fields = {k: v for k, v in body.items() if k not in ("error", "status", "retry_after_s")}
    if retry_after_s is None and isinstance(body.get("retry_after_s"), int | float):
        retry_after_s = float(body["retry_after_s"])
    return kind(status, message, retry_after_s, **fields)
