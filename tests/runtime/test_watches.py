"""The watches on a version's mapped files, per slot (``runtime/watches.py``)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fnrt.loader.integrity import identity
from fnrt.loader.scrub import Mapped, Scrubber, Watch
from fnrt.runtime.watches import FileWatches


@dataclass
class Slot:
    index: int = 0
    instance: Any = None
    running: bool = False
    last_active: float = 0.0
    primary: bool = True


async def no_retire(slot: Any, instance: Any) -> None:
    raise AssertionError("nothing changed")


def watched_blob(tmp_path: Path) -> Mapped:
    blob = tmp_path / "weights"
    blob.write_bytes(b"w" * 4096)
    return Mapped(blob, "d" * 64, identity(blob), "0")


async def watching(scrubber: Scrubber, timeout_s: float = 2.0) -> bool:
    """Whether the scrubber still holds a watch ``timeout_s`` on (False once it has none)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while scrubber._files() and loop.time() < deadline:
        await asyncio.sleep(0.01)
    return bool(scrubber._files())


def test_a_watch_started_for_a_load_is_kept_and_stopped_with_its_slot(tmp_path: Path) -> None:
    scrubber = Scrubber()
    mapped = watched_blob(tmp_path)
    watches = FileWatches(
        None,  # type: ignore[arg-type]  # only handed to watch_files
        lambda _: scrubber.watch([mapped]),
        no_retire,
    )
    slot = Slot()

    async def main() -> None:
        await watches.start(slot, object())  # type: ignore[arg-type]
        assert scrubber._files() == [mapped]
        assert watches.found(slot) is None
        assert watches.stop(slot) is None
        assert scrubber._files() == []

    asyncio.run(main())


def test_a_watch_whose_load_was_cancelled_while_it_started_is_closed(tmp_path: Path) -> None:
    """The load is cancelled while the watch starts on its thread: the thread goes on
    and registers the watch with the scrub, which nobody held. It watched (and re-read)
    the files of an instance that was never served, for as long as the node ran."""
    scrubber = Scrubber()
    mapped = watched_blob(tmp_path)
    entered, release, started = threading.Event(), threading.Event(), threading.Event()

    def watch_files(_: Any) -> Watch:
        entered.set()
        release.wait(10)
        watch = scrubber.watch([mapped])
        started.set()
        return watch

    watches = FileWatches(None, watch_files, no_retire)  # type: ignore[arg-type]
    slot = Slot()

    async def main() -> None:
        start = asyncio.ensure_future(watches.start(slot, object()))  # type: ignore[arg-type]
        await asyncio.to_thread(entered.wait, 10)
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start
        release.set()
        await asyncio.to_thread(started.wait, 10)  # registered: then closed, on the loop
        assert not await watching(scrubber)
        assert watches.stop(slot) is None  # nothing kept for the slot either

    asyncio.run(main())
