"""fnrt's app as ``fnrt serve`` builds it, for Granian's ASGI interface (``bench/stacks.py``).

    FNRT_STORE=DIR FNRT_CACHE_DIR=DIR granian --interface asgi --factory granian_fnrt:app

The settings are ``fnrt serve``'s defaults but the store and cache folders;
the request log goes to stderr as there. Granian's own HTTP replaces uvicorn's,
so the data routes go through ASGI (fnrt answers them at the connection only on
its own uvicorn protocol), and none of what fnrt adds to uvicorn (the connection
cap, header and body deadlines, the drain) applies.
"""

from __future__ import annotations

import os
from pathlib import Path

from starlette.applications import Starlette

from fnrt.runtime.http.app import build_app
from fnrt.runtime.settings import ServerSettings
from fnrt.tracing.logs import configure_logging


def app() -> Starlette:
    configure_logging("warning", json_lines=False)
    settings = ServerSettings(
        store=os.environ["FNRT_STORE"], cache_dir=Path(os.environ["FNRT_CACHE_DIR"])
    )
    return build_app(settings)
