"""Hooks for the schemathesis run in ``test_openapi.py`` (loaded via SCHEMATHESIS_HOOKS)."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    # A deadline the client sets and the server keeps is a 504 by design (documented):
    # generated tiny deadlines (5e-324 ms, in the coverage phase too) would read as server
    # errors. The header's schema against the server: test_openapi.py, on its own.
    if case.headers:
        case.headers.pop("x-fnrt-timeout-ms", None)


@schemathesis.serializer("application/msgpack")
def msgpack_body(ctx: Any, value: Any) -> bytes:
    # Generated values are JSON-like; split bodies are msgpack maps (docs/edge.md).
    import msgpack

    packed: bytes = msgpack.packb(value, use_bin_type=True, default=str)
    return packed


@schemathesis.deserializer("application/msgpack")
def msgpack_answer(ctx: Any, response: Any) -> Any:
    import msgpack

    return msgpack.unpackb(response.content, raw=False, strict_map_key=False)
