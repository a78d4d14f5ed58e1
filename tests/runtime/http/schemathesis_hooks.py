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
