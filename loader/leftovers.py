"""Temporary files a killed process left behind, found and removed at start.

An upload spooled to ``cache/uploads`` and a store write in progress
(``write_atomic``'s ``.NAME.PID.XXXX.tmp`` beside its target), and a blob
the L2 cache is downloading (``cache/tmp``), are named with the id of
the process writing them. At start a node removes those whose
process is gone: a ``kill -9`` during a 200 MB deploy left 260 MB behind.
Files of processes still running (another node on the same folder) stay.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("fnrt.loader")

#: A temporary file of an unknown writer (no process id in its name) older than this goes.
UNNAMED_AGE_S = 3600.0
_STORE_TMP = re.compile(r"^\..+\.(\d+)\.[^.]+\.tmp$")
_SPOOL = re.compile(r"^[0-9a-f]{1,16}\.(\d+)\.")


def alive(pid: int) -> bool:
    """Whether a process with this id runs (on this machine)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: it runs
        return True
    return True


def _stale(path: Path, pattern: re.Pattern[str], now: float) -> bool:
    match = pattern.match(path.name)
    if match is not None:
        return not alive(int(match.group(1)))
    with contextlib.suppress(FileNotFoundError):
        return now - path.stat().st_mtime > UNNAMED_AGE_S
    return False


def _files(root: Path, recursive: bool) -> Iterator[Path]:
    if not root.is_dir():
        return
    if not recursive:
        yield from (p for p in root.iterdir() if p.is_file())
        return
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".tmp"):
                yield Path(folder) / name


def writer_gone(path: Path) -> bool:
    """Whether ``path``, named ``HEX.PID.…`` (an upload spool, a cache download), was
    left by a process that is gone (unnamed: older than ``UNNAMED_AGE_S``)."""
    return _stale(path, _SPOOL, time.time())


def remove_leftovers(uploads: Path, store_root: Path | None = None) -> int:
    """Remove upload spools in ``uploads`` and a folder store's temporaries under
    ``store_root`` whose writer is gone; the bytes freed."""
    now, freed = time.time(), 0
    candidates = [(p, _SPOOL) for p in _files(uploads, recursive=False)]
    if store_root is not None:
        candidates += [
            (p, _STORE_TMP) for p in _files(store_root, recursive=True) if p.name.startswith(".")
        ]
    for path, pattern in candidates:
        if not _stale(path, pattern, now):
            continue
        with contextlib.suppress(FileNotFoundError):
            size = path.stat().st_size
            path.unlink()
            freed += size
            log.info("removed %s (%d bytes) left by a process that is gone", path, size)
    return freed
