"""Temporaries of killed processes go at start; a live writer's stay."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from fnrt.loader.leftovers import UNNAMED_AGE_S, remove_leftovers


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_the_temporaries_of_gone_processes_are_removed(tmp_path: Path) -> None:
    uploads, store = tmp_path / "uploads", tmp_path / "store"
    (store / "blobs" / "ab").mkdir(parents=True)
    uploads.mkdir()
    gone, here = dead_pid(), os.getpid()
    dead_spool = uploads / f"abcdef0123456789.{gone}.x1y2"
    live_spool = uploads / f"abcdef0123456789.{here}.z3w4"
    dead_tmp = store / "blobs" / "ab" / f".abcd.{gone}.q9r8.tmp"
    live_tmp = store / "blobs" / "ab" / f".abcd.{here}.s7t6.tmp"
    blob = store / "blobs" / "ab" / "abcd"
    old_unnamed = uploads / "something"
    for path in (dead_spool, live_spool, dead_tmp, live_tmp, blob, old_unnamed):
        path.write_bytes(b"x" * 100)
    long_ago = time.time() - UNNAMED_AGE_S - 60
    os.utime(old_unnamed, (long_ago, long_ago))
    assert remove_leftovers(uploads, store) == 300
    assert not dead_spool.exists() and not dead_tmp.exists() and not old_unnamed.exists()
    assert live_spool.exists() and live_tmp.exists() and blob.exists()


def test_missing_folders_are_nothing_to_clean(tmp_path: Path) -> None:
    assert remove_leftovers(tmp_path / "none", tmp_path / "nostore") == 0
