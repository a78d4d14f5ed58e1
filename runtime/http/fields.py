"""Request heads refused before any route reads them: fields that a proxy in front could
read one way and this server another.

- A transfer coding other than ``chunked`` (``gzip, chunked``): uvicorn read the
  chunks and handed on what they held as if it were the body, still encoded. RFC
  9112 6.1: a server SHOULD answer 501 to a coding it does not understand.
- ``Host`` more than once: RFC 9112 3.2 says 400.
- ``Content-Type`` twice with different values: the connection's data routes read
  the last, the ASGI app (Starlette) the first; a field that may appear once (RFC 9110
  5.3) is refused 400 rather than read either way.

:func:`check` runs on every request head that names a field twice or has a
``Transfer-Encoding``; the usual request costs the connection one ``dict`` of its fields.
"""

from __future__ import annotations

from collections.abc import Sequence


class RefusedHead(ValueError):
    """A request head refused: its status line and why (the connection answers it and
    closes, after the answers of the requests before it)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


#: Fields a request may carry only once, and whether two equal values pass.
SINGLE: dict[bytes, bool] = {b"host": False, b"content-type": True}


def check(headers: Sequence[tuple[bytes, bytes]]) -> None:
    """Raise :class:`RefusedHead` for a head this server will not read (``headers``:
    names lowercased, as uvicorn keeps them)."""
    for name, value in headers:
        if name == b"transfer-encoding":
            for coding in value.split(b","):
                coding = coding.strip().lower()
                if coding and coding != b"chunked":
                    shown = coding.decode("latin-1")[:40]
                    raise RefusedHead(
                        "501 Not Implemented",
                        f"transfer coding '{shown}' is not supported: send the body as it "
                        "is, or chunked",
                    )
    for name, equal_pass in SINGLE.items():
        values = [value for field, value in headers if field == name]
        if len(values) > 1 and not (equal_pass and len(set(values)) == 1):
            field, times = name.decode("latin-1"), len(values)
            raise RefusedHead("400 Bad Request", f"'{field}' is given {times} times")
