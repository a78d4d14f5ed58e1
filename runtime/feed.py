"""Where this node stopped reading the store's change feed (``fnrt.loader.changes``).

Every routing write appends to the feed; a node polls it with one conditional
GET (a 304 while nothing moved) and then reads only the functions it names.
:class:`FeedCursor` keeps the generation and ETag read last and says which of
the functions served here moved since; the registry applies their routing. A
read whose routing could not be applied is rewound, so it is read again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from fnrt.loader.repository import Repository

T = TypeVar("T")

#: A cursor's place: the feed's generation applied here and its ETag when read.
Position = tuple[int, str]


class FeedCursor:
    """The change feed as far as this node has read it."""

    def __init__(self, repository: Repository) -> None:
        self._repository = repository
        self._generation = 0  # the change feed's generation applied here
        self._etag = ""  # its ETag when read ("": not read yet)

    @property
    def position(self) -> Position:
        return self._generation, self._etag

    def rewind(self, position: Position) -> None:
        """Back to ``position``: what was read since is read again next time."""
        self._generation, self._etag = position

    async def moved(
        self,
        served: Mapping[str, T],
        written: Callable[[Iterable[str] | None], object] | None = None,
    ) -> list[T] | None:
        """Read the feed if it moved: those of ``served`` (by function name) that changed
        since the last read (all of them when the feed no longer reaches back, or at the
        first read), or None when it did not move. ``written`` is told the names of
        every function that changed, served here or not (None: any may have)."""
        polled = await asyncio.to_thread(self._repository.read_feed, self._etag)
        if polled is None:
            return None
        feed, etag = polled
        names = feed.since(self._generation) if self._etag else None
        if written is not None:
            written(names)
        if names is None:  # first read, or too far behind: everything served here
            targets = list(served.values())
        else:
            targets = [served[n] for n in names if n in served]
        self._generation, self._etag = feed.generation, etag
        return targets

    async def store_answers(self) -> None:
        """One conditional read of the change feed; raises what the store raised."""
        await asyncio.to_thread(self._repository.read_feed, self._etag or "-")
