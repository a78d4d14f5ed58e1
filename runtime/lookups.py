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
- at most ``MISSING_NAMES`` names are noted (past it they are forgotten at once);
- a function's stored version ids, which OIP's model metadata lists (a store
  listing, an S3 LIST), are listed again at most every ``MISSING_FOR_S`` or once
  the feed names the function (``versions``);
- a flood of distinct made-up names would still cost a read each, and queue
  before the first calls of real functions. So the node keeps the names the
  store listed when it started (``listed``) and those the change feed has named
  since (``stored``): a name among them is read in a lane of its own, and one
  outside them (made up, or deployed elsewhere since the last feed poll), like a
  version id not held here, in a second lane of ``READS_AT_ONCE`` reads where at
  most ``UNLISTED_WAITING`` names wait or are read; past that a request for
  another such name is answered ``Overloaded`` (429, retry after a second) with
  no read: the name was not looked for. When the feed no longer reaches back to
  where this node read it, the names are listed again (``relist``, one listing
  at a time, retried after ``RELIST_RETRY_S`` if the store failed), every name
  read in the first lane meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Generic, NoReturn, TypeVar

from fnrt.functions.errors import FunctionNotFound, Overloaded, VersionNotFound
from fnrt.runtime.clock import Clock

T = TypeVar("T")
V = TypeVar("V")

log = logging.getLogger("fnrt.registry")

#: How long the data path answers a name the store did not hold without reading it
#: again (the change feed drops the note as soon as it names the function).
MISSING_FOR_S = 2.0
#: Names noted as missing at most; past it, all are forgotten.
MISSING_NAMES = 4096
#: Names read from the store at once in each lane (one thread each, from the loop's
#: default pool).
READS_AT_ONCE = 4
#: Names the store did not list and the feed did not name, and version ids not held
#: here, waiting for a read or being read at once (the requests for one name wait for
#: its read); past it, a request for another is answered Overloaded (429) unread.
UNLISTED_WAITING = 64
#: How long after a listing of the store's functions failed it is tried again.
RELIST_RETRY_S = 30.0
#: The refusals of the second lane are logged at most this often.
REFUSALS_LOGGED_EVERY_S = 60.0


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
        unlisted_waiting: int = UNLISTED_WAITING,
        relist: Callable[[], Awaitable[Iterable[str]]] | None = None,
        relist_retry_s: float = RELIST_RETRY_S,
        written: Callable[[set[str] | None], object] | None = None,
    ) -> None:
        self._table = table
        self._clock = clock
        self._missing_for_s = missing_for_s
        self._most_missing = most_missing
        self._missing: dict[str, float] = {}  # name -> when the store did not hold it
        self._locks: dict[str, _NameLock] = {}
        self._reads = asyncio.Semaphore(reads_at_once)
        self._told = 0  # calls of stored(): a read that began before one notes nothing
        #: the names the store listed and the feed named since (None: not listed yet,
        #: or being listed again: every name is read in the first lane)
        self._listed: set[str] | None = None
        self._unlisted = asyncio.Semaphore(reads_at_once)  # the second lane
        self._most_unlisted = unlisted_waiting
        self._unlisted_now = 0  # names in the second lane, waiting or being read
        self.refused = 0  # requests refused because the second lane was full
        self._logged_refused = 0  # ``refused`` when last logged
        self._logged_at = -REFUSALS_LOGGED_EVERY_S  # when (the clock's now)
        self._relist = relist
        self._relist_retry_s = relist_retry_s
        self._relisting: asyncio.Task[list[str]] | None = None
        self._again = False  # the feed could not say again while a listing ran
        self._retry: asyncio.TimerHandle | None = None  # a failed listing's next try
        self._named: set[str] = set()  # what the feed named while the names were listed
        self._keeps_names = False  # listed once (then listed again when the feed cannot say)
        #: each function's stored version ids as a public route last read them, and when
        self._versions: dict[str, tuple[float, list[str]]] = {}
        #: told the names :meth:`stored` is told (None: any), to drop what it kept of them
        self._written = written

    @property
    def told(self) -> int:
        """How often :meth:`stored` was told of writes: what a read that began before
        the count moved found may be out of date, and is not kept."""
        return self._told

    def missing(self, name: str) -> bool:
        """Whether the store did not hold ``name`` within the last ``missing_for_s``."""
        at = self._missing.get(name)
        return at is not None and self._clock.now() - at < self._missing_for_s

    def listed(self, names: Iterable[str]) -> None:
        """The names the store holds, as listed (at the node's start): from now on a name
        neither among them nor named by the feed since is read in the second lane."""
        self._listed = set(names) | self._named
        self._named = set()
        self._keeps_names = True

    def stored(self, names: Iterable[str] | None) -> None:
        """``names`` were written to the store (None: any may have been): read them
        again when asked, in the first lane. None, once the names were listed: they are
        listed again (``relist``), every name read in the first lane meanwhile."""
        self._told += 1
        named = None if names is None else set(names)  # (once: ``names`` may be an iterator)
        if self._written is not None:
            self._written(named)
        if named is None:
            self._missing.clear()
            self._versions.clear()
            if self._keeps_names:  # listed once: listed again (a failed listing too)
                self._listed = None
                self._start_relisting()
            return
        for key in [k for k in self._missing if k.partition(" ")[0] in named]:
            del self._missing[key]  # the function, and its versions ("name version")
        for name in named:
            self._versions.pop(name, None)
        if self._listed is not None:
            self._listed |= named
        elif self._relisting is not None:
            self._named |= named

    def _start_relisting(self) -> None:
        """List the store's names again: now, or once the listing under way ends (which
        may miss what the feed could not name since it began): one at a time."""
        if self._relisting is not None:
            self._again = True
            return
        self._again = False
        self._named = set()
        if self._relist is not None:
            relisting = asyncio.ensure_future(self._list_again(self._relist))
            self._relisting = relisting
            relisting.add_done_callback(self._relisted)

    @staticmethod
    async def _list_again(relist: Callable[[], Awaitable[Iterable[str]]]) -> list[str]:
        return list(await relist())

    def _relisted(self, relisting: asyncio.Task[list[str]]) -> None:
        error = None if relisting.cancelled() else relisting.exception()
        if relisting is not self._relisting:
            return  # closed
        self._relisting = None
        if self._again:  # the feed could not say again meanwhile
            self._start_relisting()
        elif error is not None:  # every name stays in the first lane until it is listed
            log.warning(
                "listing the store's functions again failed (tried again in %.0f s): %s",
                self._relist_retry_s,
                error,
            )
            loop = asyncio.get_running_loop()
            self._retry = loop.call_later(self._relist_retry_s, self._retry_listing)
        elif not relisting.cancelled():
            self.listed(relisting.result())

    def _retry_listing(self) -> None:
        self._retry = None
        if self._listed is None and self._relisting is None:
            self._start_relisting()

    def close(self) -> None:
        """Stop a listing under way, or one to come."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._relisting is not None:
            relisting, self._relisting = self._relisting, None
            relisting.cancel()

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
            listed = fresh or self._listed is None or name in self._listed
            made = await self._read(name, read, FunctionNotFound, listed)
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
            return await self._read(key, read, VersionNotFound, listed=False)

    async def versions(self, name: str, read: Callable[[], Awaitable[list[str]]]) -> list[str]:
        """The version ids ``read()`` lists for ``name`` (a store listing, for a public
        route: OIP's model metadata), listed again at most every ``missing_for_s`` or
        once the feed names the function, one listing of a name at a time."""
        kept = self._versions.get(name)
        if kept is not None and self._clock.now() - kept[0] < self._missing_for_s:
            return list(kept[1])
        async with self.locked(f"{name} /versions"):  # (no version id holds a "/")
            kept = self._versions.get(name)  # listed while this waited
            if kept is not None and self._clock.now() - kept[0] < self._missing_for_s:
                return list(kept[1])
            told = self._told
            listed = await read()  # a function served here: no lane (one a name at a time)
            if told == self._told:  # else the feed may have named it meanwhile
                if len(self._versions) >= self._most_missing:
                    self._versions.clear()
                self._versions[name] = (self._clock.now(), list(listed))
            return listed

    async def _read(
        self,
        key: str,
        read: Callable[[], Awaitable[V]],
        absent: type[FunctionNotFound | VersionNotFound],
        listed: bool,
    ) -> V:
        """``read()`` when there is room for it in its lane (the first for a ``listed``
        name); ``key`` noted missing if it raised ``absent`` and the feed said nothing
        meanwhile. In the second lane, past ``UNLISTED_WAITING`` names, Overloaded with
        no read."""
        if listed:
            return await self._read_in(self._reads, key, read, absent)
        if self._unlisted_now >= self._most_unlisted:
            self._refuse()
        self._unlisted_now += 1
        try:
            return await self._read_in(self._unlisted, key, read, absent)
        finally:
            self._unlisted_now -= 1

    def _refuse(self) -> NoReturn:
        """Overloaded: the second lane is full (logged at most once a minute)."""
        self.refused += 1
        now = self._clock.now()
        if now - self._logged_at >= REFUSALS_LOGGED_EVERY_S:
            log.warning(
                "%d requests for names the store did not list (or version ids not held "
                "here) refused unread (429) since the last such line: %d such names were "
                "waiting for a store read",
                self.refused - self._logged_refused,
                self._most_unlisted,
            )
            self._logged_refused, self._logged_at = self.refused, now
        raise Overloaded(
            f"{self._most_unlisted} names this node does not know (not deployed, or "
            "deployed a moment ago elsewhere) are waiting for a store read: retry",
            retry_after_s=1.0,
        )

    async def _read_in(
        self,
        lane: asyncio.Semaphore,
        key: str,
        read: Callable[[], Awaitable[V]],
        absent: type[Exception],
    ) -> V:
        async with lane:
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
