"""Hooks for the schemathesis run in ``test_openapi.py`` (loaded via SCHEMATHESIS_HOOKS)."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def map_headers(ctx: Any, headers: dict[str, Any] | None) -> dict[str, Any] | None:
    # A deadline the client sets and the server keeps is a 504 by design (documented):
    # generated tiny deadlines would read as server errors.
    if headers:
        headers.pop("x-fnrt-timeout-ms", None)
    return headers


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
