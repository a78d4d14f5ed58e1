"""Where a node stopped reading the change feed: a real folder store, no server."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fnrt.functions.routing import Routing
from fnrt.loader.repository import Repository
from fnrt.loader.stores import FileStore
from fnrt.runtime.feed import FeedCursor


def _route(repository: Repository, name: str, version: str) -> None:
    repository.update_routing(name, lambda _: Routing.first(version, "2026-01-01T00:00:00Z"))


def test_the_cursor_names_what_moved_since_it_last_read(tmp_path: Path) -> None:
    async def scenario() -> None:
        repository = Repository(FileStore(tmp_path / "store"))
        served = {"a": "entry a", "b": "entry b", "c": "entry c"}
        cursor = FeedCursor(repository)
        assert await cursor.moved(served) == list(served.values())  # first read: all
        assert await cursor.moved(served) is None  # nothing moved: a 304
        _route(repository, "b", "v-1")
        _route(repository, "elsewhere", "v-1")  # not served here
        before = cursor.position
        assert await cursor.moved(served) == ["entry b"]
        cursor.rewind(before)  # its routing could not be applied: read again
        assert await cursor.moved(served) == ["entry b"]
        assert await cursor.moved(served) is None
        await cursor.store_answers()

    asyncio.run(scenario())
