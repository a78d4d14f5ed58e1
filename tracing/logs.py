"""Logging set-up for the server and CLI: plain text for people, JSON lines for machines.

Nothing is configured on import; ``fnrt serve`` calls :func:`configure_logging`.
"""

from __future__ import annotations

import logging
import sys
import time

import orjson


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def configure_logging(level: str = "info", *, json_lines: bool = False) -> None:
    """Send fnrt's logs to stderr at ``level`` (the request log has its own writer:
    :mod:`fnrt.tracing.access`)."""
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger("fnrt")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
