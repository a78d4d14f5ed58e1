"""The one error hierarchy of fnrt.

Every failure a user can see is an :class:`FnrtError` subclass with structured
fields. Only the HTTP layer (``fnrt.runtime.http.problems``) turns them into
status codes and bodies; the CLI turns them into messages and exit codes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class FnrtError(Exception):
    """Base class of every error fnrt raises on purpose."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields

    def to_dict(self) -> dict[str, Any]:
        """The error as a JSON-able mapping: ``{"error": message, **fields}``."""
        return {"error": self.message, **self.fields}


class ManifestError(FnrtError, ValueError):
    """A function manifest is invalid; ``field`` names the part at fault.

    Also a ``ValueError``: config dataclasses raise it from ``__post_init__``.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"manifest field '{field}': {message}", field=field)
        self.field = field
        self.reason = message

    def under(self, prefix: str) -> ManifestError:
        """The same error with its field placed under ``prefix`` (``batching.`` + field)."""
        return ManifestError(f"{prefix}.{self.field}", self.reason)


class HandlerError(FnrtError):
    """The handler code cannot be imported or does not follow the contract."""


class NotFound(FnrtError):
    """Base of the 'no such thing' errors."""


class FunctionNotFound(NotFound):
    def __init__(self, name: str) -> None:
        super().__init__(f"function '{name}' is not deployed", function=name)


class VersionNotFound(NotFound):
    def __init__(self, name: str, version: str) -> None:
        super().__init__(
            f"function '{name}' has no version '{version}'", function=name, version=version
        )


class BlobNotFound(NotFound):
    def __init__(self, digest: str) -> None:
        super().__init__(f"blob sha256:{digest} is not in the store", digest=digest)


class BadRequest(FnrtError):
    """The request body cannot be decoded at all (malformed JSON or msgpack)."""


class BadBundle(BadRequest):
    """A code bundle that is not a plain .tar.gz of files inside its folder."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the code bundle is refused: {reason}")


class InvalidInput(FnrtError):
    """A decoded request does not match the function's declared inputs."""

    def __init__(self, message: str, *, input: str | None = None) -> None:
        if input is None:
            super().__init__(message)
        else:
            super().__init__(message, input=input)
        self.input = input


class BadRecord(InvalidInput):
    """One record of a job does not match the function's inputs (422): named by its
    index (from 0) and, in JSON Lines, its line (from 1)."""

    def __init__(self, record: int, line: int | None, cause: FnrtError) -> None:
        where = f"record {record}" + (f" (line {line})" if line is not None else "")
        FnrtError.__init__(self, f"{where}: {cause.message}", record=record, **cause.fields)
        if line is not None:
            self.fields["line"] = line
        self.input = cause.fields.get("input")


class MalformedRecords(BadRequest):
    """A job's record file cannot be read (400), at the record (and line) named."""

    def __init__(self, record: int, line: int | None, reason: str) -> None:
        where = f"record {record}" + (f" (line {line})" if line is not None else "")
        fields: dict[str, Any] = {"record": record}
        if line is not None:
            fields["line"] = line
        super().__init__(f"{where}: {reason}", **fields)


class PayloadTooLarge(FnrtError):
    def __init__(self, limit_bytes: int, hint: str = "") -> None:
        message = f"request body is larger than the limit of {limit_bytes} bytes"
        super().__init__(f"{message}; {hint}" if hint else message, limit_bytes=limit_bytes)


class TensorTooLarge(FnrtError):
    """A tensor's declared shape is past the server's limits (413)."""

    def __init__(self, name: str | None, shape: Iterable[int], reason: str, **limits: int) -> None:
        dims = list(shape)
        if name is None:  # an array inside a msgpack body, before its key is known
            super().__init__(f"an array of shape {dims}: {reason}", **limits)
        else:
            super().__init__(f"input '{name}' of shape {dims}: {reason}", input=name, **limits)


class ResponseTooLarge(FnrtError):
    """An answer would be larger than ``max_response_bytes`` once encoded (413)."""

    def __init__(self, estimate_bytes: int, limit_bytes: int, hint: str) -> None:
        super().__init__(
            f"the response would be about {estimate_bytes} bytes, over the server's limit of "
            f"{limit_bytes} (--max-response-bytes); {hint}",
            estimate_bytes=estimate_bytes,
            limit_bytes=limit_bytes,
        )


class BodyTimeout(FnrtError):
    """A request body stalled longer than the server waits between reads (408)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            f"the request body stalled for {timeout_s:g} s (--body-timeout-s)", timeout_s=timeout_s
        )


class BodyTooSlow(BodyTimeout):
    """A request body arrived slower than the server's minimum rate (408)."""

    def __init__(self, rate_bytes_s: float, min_rate_bytes_s: float, window_s: float) -> None:
        FnrtError.__init__(
            self,
            f"the request body arrived at {rate_bytes_s:.1f} bytes/s over {window_s:g} s, under "
            f"the server's minimum of {min_rate_bytes_s:.10g} bytes/s (--min-body-rate-bytes-s)",
            rate_bytes_s=round(rate_bytes_s, 1),
            min_rate_bytes_s=min_rate_bytes_s,
            window_s=window_s,
        )


class UnsupportedMediaType(FnrtError):
    """The body's Content-Type or the requested Accept type is not one fnrt speaks."""


class Overloaded(FnrtError):
    """A bounded queue is full; the client should retry after ``retry_after_s``."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(FnrtError):
    """A request's deadline passed while it waited in the queue; it was never computed."""


class Unavailable(FnrtError):
    """The function cannot serve right now (draining, deleted, store unreachable)."""


class ClientLeft(FnrtError):
    """The client disconnected while its request waited: it was dropped, never computed."""


class Unauthorized(FnrtError):
    pass


class Conflict(FnrtError):
    """A conditional write lost a race (routing changed since it was read)."""


class IntegrityError(FnrtError):
    """Bytes do not hash to the digest they were stored or announced under."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(
            f"content hashes to sha256:{actual}, expected sha256:{expected}",
            expected=expected,
            actual=actual,
        )


class StoreError(FnrtError):
    """The object store failed (not a missing key: that is NotFound)."""


class CorruptBlob(FnrtError):
    """A stored file no longer holds what its digest says: it is never served (500)."""

    def __init__(self, digest: str, path: str, how: str) -> None:
        super().__init__(
            f"blob sha256:{digest} at {path} is corrupt ({how}): refusing to serve it; "
            "restore the file or deploy the version again",
            digest=digest,
            path=path,
        )


class BadOutput(FnrtError):
    """A handler's output cannot be sent as it is (NaN or infinite values in JSON, say):
    the server's fault, not the request's (500)."""


class LoadError(FnrtError):
    """The handler's ``load`` raised; ``error_id`` points at the logged traceback."""

    def __init__(self, function: str, error_id: str, reason: str) -> None:
        super().__init__(
            f"function '{function}' failed to load: {reason}", function=function, error_id=error_id
        )
        self.error_id = error_id


class HandlerFailed(FnrtError):
    """The handler raised or broke the contract while serving a batch."""

    def __init__(self, function: str, error_id: str, reason: str) -> None:
        super().__init__(
            f"function '{function}' failed: {reason}", function=function, error_id=error_id
        )
        self.error_id = error_id


class EnvironmentFailed(FnrtError):
    """A function's ``[environment]`` could not be resolved or installed (422 at deploy)."""

    def __init__(self, doing: str, said: str) -> None:
        super().__init__(f"the function's environment failed {doing} its requirements:\n{said}")


class DeployRejected(FnrtError):
    """A new version failed to load, warm up or pass its probe: it got no traffic."""

    def __init__(self, function: str, version: str, reason: str) -> None:
        super().__init__(
            f"version {version} of '{function}' was not rolled out: {reason}",
            function=function,
            version=version,
            reason=reason,
        )


class CircuitOpen(Unavailable):
    """The version's circuit breaker is open and the function has no fallback."""

    def __init__(
        self, function: str, version: str, retry_after_s: float, last_failure: str | None = None
    ) -> None:
        why = f" (the last failure: {last_failure})" if last_failure else ""
        super().__init__(
            f"function '{function}' version {version} is failing: its circuit breaker is open{why}",
            function=function,
            version=version,
        )
        self.retry_after_s = retry_after_s


class VersionRetired(Unavailable):
    """The version stopped taking requests (it left the routing); route the request again."""


class NoSuchSplit(NotFound):
    """A split request names a function without split points, or a split it lacks."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"function '{name}': {message}", function=name)


class InstanceLost(HandlerFailed):
    """An instance died or was killed while serving a batch; ``cause`` says how.

    Only the requests of that batch fail; the instance is replaced (restarted
    with backoff). ``cause`` is a short word for metrics: ``signal``, ``exit``,
    ``memory``, ``timeout``.
    """

    def __init__(self, function: str, error_id: str, reason: str, *, cause: str) -> None:
        super().__init__(function, error_id, reason)
        self.fields["cause"] = cause
        self.cause = cause
        self.reason = reason


class InstanceStopped(Unavailable):
    """A batch was stopped while it ran (an unload, a shutdown): 503, retry elsewhere or
    later; the instance was abandoned."""

    def __init__(self, function: str, reason: str) -> None:
        super().__init__(f"function '{function}': {reason}; retry", function=function)


class WeightsChanged(InstanceStopped):
    """A file a loaded instance maps changed on disk under it (503): what it computed
    after that is not served; the instance is replaced from a verified copy."""

    def __init__(self, function: str, reason: str) -> None:
        super().__init__(function, f"{reason}; its answer was not served")


class HandlerTimeout(InstanceLost, DeadlineExceeded):
    """A batch ran past the function's ``isolation.timeout_s``: 504, instance replaced."""

    def __init__(self, function: str, error_id: str, timeout_s: float) -> None:
        super().__init__(
            function,
            error_id,
            f"the handler ran past its timeout of {timeout_s:g} s and was stopped",
            cause="timeout",
        )
