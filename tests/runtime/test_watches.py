"""The watches on a version's mapped files, per slot (``runtime/watches.py``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fnrt.loader.integrity import identity
from fnrt.loader.scrub import Mapped, Scrubber
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


def test_a_watch_opened_for_a_load_is_kept_and_stopped_with_its_slot(tmp_path: Path) -> None:
    scrubber = Scrubber()
    mapped = watched_blob(tmp_path)
    watches = FileWatches(
        None,  # type: ignore[arg-type]  # only handed to watch_files
        lambda _: scrubber.watch([mapped]),
        no_retire,
    )
    slot = Slot()

    async def main() -> None:
        watches.adopt(slot, object(), watches.open())  # type: ignore[arg-type]
        assert scrubber._files() == [mapped]
        assert watches.found(slot) is None
        assert watches.stop(slot) is None
        assert scrubber._files() == []

    asyncio.run(main())
