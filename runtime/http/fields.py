"""Request heads refused before any route reads them: fields that a proxy in front could
read one way and this server another.

- A transfer coding other than ``chunked`` (``gzip, chunked``): uvicorn read the
  chunks and handed on what they held as if it were the body, still encoded. RFC
  9112 6.1: a server SHOULD answer 501 to a coding it does not understand.
- ``Host`` more than once: RFC 9112 3.2 says 400.
- ``Content-Type`` twice with different values: the connection's data routes read
  the last, the ASGI app (Starlette) the first; a field that may appear once (RFC 9110
  5.3) is refused 400 rather than read either way.

:func:`refusal` runs on every request head that names a field twice or has a
``Transfer-Encoding``; the usual request costs the connection one ``dict`` of its
fields. A refused request is answered by :func:`refusing_app` in place of the route,
as a request of the connection like any other (after the answers of those before it,
its body under the same deadlines and minimum rate), and the connection closes.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

#: Fields a request may carry only once, and whether two equal values pass.
SINGLE: dict[bytes, bool] = {b"host": False, b"content-type": True}
#: The most of a refused request's body read (and dropped) before its answer: a client
#: still sending when the connection closes meets a reset, and may never read the
#: answer. Past it the answer goes at once.
MAX_DISCARDED_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class RefusedHead:
    """A request head refused: its status and why."""

    status: HTTPStatus
    message: str


def refusal(headers: Sequence[tuple[bytes, bytes]]) -> RefusedHead | None:
    """Why this server will not read a request with ``headers`` (names lowercased, as
    uvicorn keeps them), or None."""
    for name, value in headers:
        if name == b"transfer-encoding":
            for coding in value.split(b","):
                coding = coding.strip().lower()
                if coding and coding != b"chunked":
                    shown = coding.decode("latin-1")[:40]
                    return RefusedHead(
                        HTTPStatus.NOT_IMPLEMENTED,
                        f"transfer coding '{shown}' is not supported: send the body as it "
                        "is, or chunked",
                    )
    for name, equal_pass in SINGLE.items():
        values = [value for field, value in headers if field == name]
        if len(values) > 1 and not (equal_pass and len(set(values)) == 1):
            field, times = name.decode("latin-1"), len(values)
            return RefusedHead(HTTPStatus.BAD_REQUEST, f"'{field}' is given {times} times")
    return None


Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def refusing_app(refused: RefusedHead) -> Callable[[Any, Receive, Send], Awaitable[None]]:
    """An ASGI app answering one request ``refused`` (JSON naming why, and
    ``Connection: close``), once its body is read and dropped (up to
    :data:`MAX_DISCARDED_BYTES`; none when the client waits for ``100 Continue``)."""
    body = json.dumps({"error": refused.message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"connection", b"close"),
        (b"content-length", str(len(body)).encode()),
    ]

    async def app(scope: Any, receive: Receive, send: Send) -> None:
        if (b"expect", b"100-continue") not in scope["headers"]:
            dropped, more = 0, True
            while more and dropped <= MAX_DISCARDED_BYTES:
                message = await receive()
                dropped += len(message.get("body", b""))
                more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": refused.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app
