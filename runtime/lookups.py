"""How a node reads a function it does not serve yet, and what it keeps of a name the
store did not hold.

A node serves whatever the store holds: the first request for a name not in its
function table reads the store (``Registry.entry``). Those reads are the
cheapest request that costs the node the most: a name nobody deployed, sent again
and again, cost a thread hop and a store read each time (measured on a folder
store: 300-350 us of the server's CPU against 86-97 for an invoke of a loaded model; on
S3 a GET each), and the reads went one at a time behind one lock, so a flood of
them held up every other function's first request and the change feed's routing
reads. So:

- reads of one name go one at a time (a lock per name: the second request finds
  what the first read), and at most ``READS_AT_ONCE`` names are read at once;
- a name the store did not hold is answered ``FunctionNotFound`` (404) to
  requests (invokes, inferences, the protocol's public model routes, split
  plans) without another read for ``MISSING_FOR_S``, unless the store's change
  feed names it first (a deploy by another node, ``fnrt deploy --store``); a
  deploy through this node, the admin views and a job's records read it again
  whatever was noted (``fresh``);
- so is a version asked for by its id (``x-fnrt-version``, OIP's
  ``/versions/{v}``) that the store did not hold: ``VersionNotFound``, until the
  feed names its function or ``MISSING_FOR_S`` passes (an id no deploy could
  make is refused before it gets here: ``Registry.get_version``);
- at most ``MISSING_NAMES`` names are noted (past it they are forgotten at once:
  a flood of distinct names costs a read each, as before, and no memory).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Generic, TypeVar

from fnrt.functions.errors import FunctionNotFound, VersionNotFound
from fnrt.runtime.clock import Clock

T = TypeVar("T")
V = TypeVar("V")

#: How long the data path answers a name the store did not hold without reading it
#: again (the change feed drops the note as soon as it names the function).
MISSING_FOR_S = 2.0
#: Names noted as missing at most; past it, all are forgotten.
MISSING_NAMES = 4096
#: Names read from the store at once (one thread each, from the loop's default pool).
READS_AT_ONCE = 4


class _NameLock:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class Lookups(Generic[T]):
    """Reads of the functions not in ``table`` (the registry's, by name), and the names
    the store did not hold when last read."""

    def __init__(
        self,
        table: Mapping[str, T],
        clock: Clock,
        missing_for_s: float = MISSING_FOR_S,
        most_missing: int = MISSING_NAMES,
        reads_at_once: int = READS_AT_ONCE,
    ) -> None:
        self._table = table
        self._clock = clock
        self._missing_for_s = missing_for_s
        self._most_missing = most_missing
        self._missing: dict[str, float] = {}  # name -> when the store did not hold it
        self._locks: dict[str, _NameLock] = {}
        self._reads = asyncio.Semaphore(reads_at_once)
        self._told = 0  # calls of stored(): a read that began before one notes nothing

    def missing(self, name: str) -> bool:
        """Whether the store did not hold ``name`` within the last ``missing_for_s``."""
        at = self._missing.get(name)
        return at is not None and self._clock.now() - at < self._missing_for_s

    def stored(self, names: Iterable[str] | None) -> None:
        """``names`` were written to the store (None: any may have been): read them
        again when asked."""
        self._told += 1
        if names is None:
            self._missing.clear()
            return
        named = set(names)
        for key in [k for k in self._missing if k.partition(" ")[0] in named]:
            del self._missing[key]  # the function, and its versions ("name version")

    @contextlib.asynccontextmanager
    async def locked(self, name: str) -> AsyncIterator[None]:
        """Hold ``name``'s lock: its reads (and routing reads) one at a time."""
        held = self._locks.get(name)
        if held is None:
            held = self._locks[name] = _NameLock()
        held.users += 1
        try:
            async with held.lock:
                yield
        finally:
            held.users -= 1
            if not held.users:
                del self._locks[name]

    async def find(self, name: str, read: Callable[[], Awaitable[T]], *, fresh: bool) -> T:
        """``name`` from the table, else ``read()`` (which puts it there), one read of a
        name at a time. Unless ``fresh``, a name noted missing raises FunctionNotFound
        with no read."""
        if not fresh and self.missing(name):
            raise FunctionNotFound(name)
        async with self.locked(name):
            found = self._table.get(name)
            if found is not None:  # read while this waited
                return found
            if not fresh and self.missing(name):  # the read before this one found none
                raise FunctionNotFound(name)
            made = await self._read(name, read, FunctionNotFound)
            self._missing.pop(name, None)
            return made

    async def find_version(
        self,
        name: str,
        version: str,
        held: Callable[[], V | None],
        read: Callable[[], Awaitable[V]],
    ) -> V:
        """A stored version of a function served here: ``held()`` when it is held here
        (looked at again once this has waited for a read of it), else ``read()``, one
        read of it at a time; a version the store did not hold a moment ago raises
        VersionNotFound with no read."""
        key = f"{name} {version}"  # (a name holds no space)
        found = held()
        if found is not None:
            return found
        if self.missing(key):
            raise VersionNotFound(name, version)
        async with self.locked(key):
            found = held()  # read, or deployed here, while this waited
            if found is not None:
                return found
            if self.missing(key):  # the read before this one found none
                raise VersionNotFound(name, version)
            return await self._read(key, read, VersionNotFound)

    async def _read(self, key: str, read: Callable[[], Awaitable[V]], absent: type[Exception]) -> V:
        """``read()`` when there is room for it; ``key`` noted missing if it raised
        ``absent`` and the feed said nothing meanwhile."""
        async with self._reads:
            told = self._told
            try:
                return await read()
            except absent:
                if told == self._told:  # else the feed may have named it meanwhile
                    if len(self._missing) >= self._most_missing:
                        self._missing.clear()
                    self._missing[key] = self._clock.now()
                raise

    def names_locked(self) -> int:
        """Names whose lock is held or awaited (each lock goes with its last user)."""
        return len(self._locks)
