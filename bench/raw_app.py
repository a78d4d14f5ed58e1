"""The HTTP floor for the serving benchmarks: a raw ASGI app answering a constant body.

The same server stack fnrt runs on (uvicorn, uvloop, httptools, one process),
no framework and no model: it reads the request body and answers the bytes
an ``mlp`` invoke answers. Whatever a server does beyond this is overhead.
Run as ``python bench/raw_app.py PORT``.

``python bench/raw_app.py PORT --connection`` is the floor of a server that
answers at the connection, as fnrt's data routes do: uvicorn's httptools
protocol parses each request (its head's callbacks as usual) and writes the
constant answer when the request ends, with no ASGI cycle, task or app.

``rsgi`` is the same answer as an RSGI app, the floor of Granian (a server in
Rust, ``bench/stacks.py``): ``granian --interface rsgi raw_app:rsgi``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

ANSWER = json.dumps({"y": [[0.123456] * 10]}).encode()
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:  # the whole body, as a server must read it
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


#: ``HEADERS`` as RSGI takes them (Granian adds the length).
RSGI_HEADERS = [("content-type", "application/json")]


async def rsgi(scope: Any, proto: Any) -> None:
    """``app`` as an RSGI app: the body read whole, the constant answered."""
    await proto()
    proto.response_bytes(200, RSGI_HEADERS, ANSWER)


#: The whole response ``app`` sends, as one buffer.
RESPONSE = (
    b"HTTP/1.1 200 OK\r\n"
    + b"".join(name + b": " + value + b"\r\n" for name, value in HEADERS)
    + b"\r\n"
    + ANSWER
)


class ConnectionAnswer(HttpToolsProtocol):
    """Answers every request at the connection: no request cycle, task or app."""

    def on_headers_complete(self) -> None:
        pass

    def on_body(self, body: bytes) -> None:
        pass

    def on_message_complete(self) -> None:
        self.transport.write(RESPONSE)


def serve(asgi: Any, port: int, http: Any = "httptools") -> None:
    """Serve ``asgi`` on the stack every serving benchmark's app runs on (fnrt's own)."""
    uvicorn.run(
        asgi,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http=http,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    serve(app, int(sys.argv[1]), ConnectionAnswer if "--connection" in sys.argv else "httptools")
