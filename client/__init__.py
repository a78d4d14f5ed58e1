"""The Python client of fnrt: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

>>> from fnrt.client import Client
>>> with Client("http://127.0.0.1:8000") as fnrt:
...     result = fnrt.invoke("mlp", x=np.ones((1, 16), np.float32))
>>> result["y"].shape, result.version

Tensors travel as msgpack; the answer's arrays come back as numpy arrays.
429 and 503 answers are retried with backoff, honouring ``Retry-After``, for
idempotent calls; every other error status raises its own class (see
``fnrt.client.errors``), carrying the server's message.
"""

from fnrt.client.async_client import AsyncClient
from fnrt.client.calls import DEFAULT_URL
from fnrt.client.client import Client
from fnrt.client.errors import (
    BadRequestError,
    ConflictError,
    DeadlineError,
    HandlerFailedError,
    InvalidInputError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    ServerError,
    UnauthorizedError,
    UnavailableError,
    Unreachable,
)
from fnrt.client.result import Result
from fnrt.client.retry import NO_RETRY, RetryPolicy
from fnrt.functions.codec import Format
from fnrt.functions.errors import FnrtError

__all__ = [
    "DEFAULT_URL",
    "NO_RETRY",
    "AsyncClient",
    "BadRequestError",
    "Client",
    "ConflictError",
    "DeadlineError",
    "FnrtError",
    "Format",
    "HandlerFailedError",
    "InvalidInputError",
    "NotFoundError",
    "OverloadedError",
    "PayloadTooLargeError",
    "Result",
    "RetryPolicy",
    "ServerError",
    "UnauthorizedError",
    "UnavailableError",
    "Unreachable",
]
