"""The functions a node serves: the function table, their routing, a scheduler per version.

A function is found in the store the first time it is asked for, so a node
serves whatever the store holds without being told; any stored version can
also be served by its id. Each request goes to a version chosen by the
function's traffic split (random, or by a sticky header's hash). Routing
written by other nodes (or by this node's deployer) is applied here, found
through the store's change feed (``fnrt.loader.changes``: one conditional GET
per poll, whatever the number of functions; where this node stopped reading it:
``feed.py``):
versions that gain traffic get a scheduler, versions that lose it are marked
with the time they left (the sweeper closes them after the rollback window).

The registry is the only one to change the function table (a function's
routing and the schedulers it holds): deploys and canaries (``deployer.py``)
and the periodic sweeps (``sweeper.py``) decide, then ask it (:meth:`Registry.hold`,
:meth:`Registry.retire`, :meth:`Registry.write`). Which version a request goes
to is the served function's (:meth:`ServedFunction.choose`); memory eviction is
``fnrt.loader.memory``'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Protocol

from fnrt.functions.errors import FunctionNotFound, VersionNotFound
from fnrt.functions.manifest import NAME_PATTERN
from fnrt.functions.routing import Routing
from fnrt.functions.version import VersionManifest
from fnrt.loader.repository import VERSION_ID, Repository
from fnrt.runtime import scheduler as sched
from fnrt.runtime.clock import Clock
from fnrt.runtime.feed import FeedCursor
from fnrt.runtime.lookups import Lookups
from fnrt.runtime.scheduler import Scheduler, SchedulerFactory
from fnrt.runtime.served import Rollbacks, ServedFunction

log = logging.getLogger("fnrt.registry")

#: Version manifests kept that no scheduler holds (read for a public route).
MANIFESTS_KEPT = 256


class Planned(Protocol):
    """The keep-alive keeper's view of a function's plan (``describe`` shows it)."""

    def planned(self, name: str) -> dict[str, Any]: ...

    def knows(self, name: str) -> bool:
        """Whether it has learned ``name``'s calls (and may pre-warm it)."""
        ...

    def forget(self, name: str) -> None:
        """``name`` was deleted: what was learned of it goes."""


class Registry:
    """Maps function names to their routing and the schedulers of their versions."""

    def __init__(
        self,
        repository: Repository,
        schedulers: SchedulerFactory,
        clock: Clock,
        keeper: Planned | None = None,
        imports_seen: Callable[[Iterable[str]], object] | None = None,
    ) -> None:
        self._keeper = keeper
        self.keeper = keeper  # what the admin views show of a function's keep-alive plan
        #: told what the versions read at the start import (``VersionManifest.imports``)
        self._imports_seen = imports_seen
        self.repository = repository
        self.clock = clock
        self._schedulers = schedulers
        self._functions: dict[str, ServedFunction] = {}
        #: the functions keeping a version warm for a rollback, noted as routing changes
        self.rollbacks = Rollbacks(self._functions)
        #: version manifests read and held by no scheduler (a public route's: OIP's model
        #: metadata of a version not served here), the last MANIFESTS_KEPT; a version id
        #: names its content, so one changes only by going (its function deleted): what
        #: is kept of a function goes whenever the store is written for it
        manifests: dict[tuple[str, str], VersionManifest] = {}
        self._manifests = manifests

        def written(names: set[str] | None) -> None:
            for key in [k for k in manifests if names is None or k[0] in names]:
                del manifests[key]

        #: reads of functions not served here, and the names the store did not hold
        self.lookups = Lookups(
            self._functions,
            clock,
            relist=lambda: asyncio.to_thread(repository.list_functions),
            written=written,
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        #: where this node stopped reading the store's change feed
        self.feed = FeedCursor(repository)

    def background(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` without awaiting it, holding a reference until it ends."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def start(self, *, preload: bool = False) -> list[asyncio.Future[None]]:
        """Read every function's routing and serving manifest; serve at once those that
        start warm (``--preload``, ``load_at_start``: their loads, running on) and those
        the keeper has learned (it may pre-warm them). The others cost nothing here
        until their first call, which reads them again; what their code imports is
        told to ``imports_seen`` (the spare workers learn it)."""
        # the feed before the routing: a change made meanwhile is seen again
        await self.feed.moved(self._functions, self.lookups.stored)
        stored, names = await asyncio.to_thread(
            starting, self.repository, self._keeper, self._imports_seen, preload
        )
        self.lookups.listed(stored)  # a name outside these and the feed's: the second lane
        warming: list[asyncio.Future[None]] = []
        for name in names:
            try:
                scheduler = await self.get(name)
            except Exception as exc:  # one broken function must not stop the node
                log.error("cannot serve %s: %s", name, exc)
                continue
            if preload or scheduler.version.manifest.scaling.load_at_start:
                warming.append(self.background(warm_logged(scheduler)))
        return warming

    async def close(self) -> None:
        self.lookups.close()
        schedulers = self.loaded()
        self._functions.clear()  # (the lookups and the rollbacks hold it too)
        closing = (sched.close(s) for s in schedulers)
        await asyncio.gather(*closing, *self._tasks, return_exceptions=True)

    # --- finding versions --------------------------------------------------------------

    async def entry(self, name: str, *, fresh: bool = True) -> ServedFunction:
        """The function ``name`` as this node serves it (read from the store once).

        Not ``fresh`` (the data path's requests): a name the store did not hold a
        moment ago is FunctionNotFound with no read (``lookups.py``)."""
        entry = self._functions.get(name)
        if entry is not None:
            return entry
        if not NAME_PATTERN.match(name):
            raise FunctionNotFound(name)

        async def read() -> ServedFunction:
            routing, etag = await asyncio.to_thread(self.repository.get_routing, name)
            schedulers = {}
            for version in routing.traffic:
                vm = await asyncio.to_thread(self.repository.get_version, name, version)
                schedulers[version] = self.new_scheduler(vm)
            entry = self._functions[name] = ServedFunction(name, routing, etag, schedulers)
            return entry

        return await self.lookups.find(name, read, fresh=fresh)

    def entries(self) -> list[ServedFunction]:
        return list(self._functions.values())

    def is_current(self, entry: ServedFunction) -> bool:
        """Whether ``entry`` is still what this node serves under its name."""
        return self._functions.get(entry.name) is entry

    @property
    def schedulers(self) -> SchedulerFactory:
        """What makes this node's schedulers (a sweep makes its own with it)."""
        return self._schedulers

    async def get(self, name: str) -> Scheduler:
        """The scheduler of the version with the largest share of ``name``'s traffic."""
        return (await self.entry(name)).primary

    async def route(self, name: str, headers: Mapping[str, str] | None = None) -> Scheduler:
        """The scheduler that answers this request, chosen by the traffic split.

        The request's sticky key picks the version (one user, one version): the
        header the primary version's manifest names in ``sticky_header``, else
        ``x-fnrt-sticky`` (what ``fnrt.client`` sends); without one, a random draw.
        """
        return (await self.entry(name, fresh=False)).choose(headers)

    def route_now(self, name: str, headers: Mapping[str, str] | None = None) -> Scheduler | None:
        """:meth:`route` without a wait, for a function already served here (the
        usual request: no coroutine to make and run); None when it must be read first."""
        entry = self._functions.get(name)
        return None if entry is None else entry.choose(headers)

    async def get_version(self, name: str, version: str, *, fresh: bool = False) -> Scheduler:
        """The scheduler of one stored version of ``name``, whatever the routing says.

        Raises FunctionNotFound or VersionNotFound; not ``fresh`` (a request's), without
        a store read for a name or version the store did not hold a moment ago."""
        if not VERSION_ID.fullmatch(version):
            raise VersionNotFound(name, version)  # no deploy makes such an id
        entry = await self.entry(name, fresh=fresh)
        scheduler = entry.schedulers.get(version)
        if scheduler is not None and not scheduler.batcher.closing:
            return scheduler

        def held() -> Scheduler | None:
            scheduler = entry.schedulers.get(version)
            return scheduler if scheduler is not None and not scheduler.batcher.closing else None

        async def read() -> Scheduler:
            vm = await asyncio.to_thread(self.repository.get_version, name, version)
            return self.held(entry, vm)

        if fresh:
            found = held()
            return found if found is not None else await read()
        return await self.lookups.find_version(name, version, held, read)

    def held(self, entry: ServedFunction, vm: VersionManifest) -> Scheduler:
        """The open scheduler ``entry`` holds for ``vm``, made if there is none."""
        scheduler = entry.schedulers.get(vm.version)
        if scheduler is None or scheduler.batcher.closing:
            scheduler = entry.schedulers[vm.version] = self.new_scheduler(vm)
        return scheduler

    async def version_manifest(
        self, name: str, version: str | None = None, *, fresh: bool = True
    ) -> VersionManifest:
        """The routed version of ``name``, or the stored version ``version``; nothing loads.
        Not ``fresh`` (a public route's), as :meth:`get_version` reads."""
        entry = await self.entry(name, fresh=fresh)
        if version is None:
            return entry.primary.version
        if not VERSION_ID.fullmatch(version):
            raise VersionNotFound(name, version)

        def held() -> VersionManifest | None:
            scheduler = entry.schedulers.get(version)
            return self._manifests.get((name, version)) if scheduler is None else scheduler.version

        async def read() -> VersionManifest:
            told = self.lookups.told
            vm = await asyncio.to_thread(self.repository.get_version, name, version)
            if told == self.lookups.told and self._functions.get(name) is entry:
                if len(self._manifests) >= MANIFESTS_KEPT:  # (kept unless written meanwhile)
                    del self._manifests[next(iter(self._manifests))]  # the first read goes
                self._manifests[name, version] = vm
            return vm

        if fresh:
            found = held()
            return found if found is not None else await read()
        return await self.lookups.find_version(name, version, held, read)

    def new_scheduler(self, vm: VersionManifest) -> Scheduler:
        """A scheduler of ``vm`` (loading now when it keeps instances at all times)."""
        scheduler = self._schedulers(vm)
        if vm.manifest.scaling.min_instances > 0:
            self.background(warm_logged(scheduler))
        return scheduler

    # --- routing -----------------------------------------------------------------------

    async def write(self, entry: ServedFunction, change: Any) -> Routing:
        """Apply ``change`` to the stored routing (a conditional write), then here."""
        repository = self.repository

        def write() -> Routing:
            return repository.update_routing(
                entry.name, lambda current: change(current or entry.routing)
            )

        await asyncio.to_thread(write)
        self.lookups.stored([entry.name])  # what was noted or listed of it is read again
        await self.refresh(entry)
        return entry.routing

    async def refresh(self, entry: ServedFunction) -> bool:
        """Serve the stored routing here if it changed; whether it did.

        The read happens under the lock, so a slow read (a watch poll) can never
        apply an older routing over a newer one a write here applied meanwhile.
        """
        async with self.lookups.locked(entry.name):
            routing, etag = await asyncio.to_thread(self.repository.get_routing, entry.name)
            if etag == entry.etag:
                return False
            await self._apply(entry, routing, etag)
            return True

    async def _apply(self, entry: ServedFunction, routing: Routing, etag: str) -> None:
        """Serve ``routing`` here: schedulers for versions with traffic, the rest retiring.

        Called with the lock held.
        """
        try:
            for version in routing.traffic:
                if version not in entry.schedulers or entry.schedulers[version].batcher.closing:
                    vm = await asyncio.to_thread(self.repository.get_version, entry.name, version)
                    scheduler = self.held(entry, vm)
                    if routing.traffic[version]:  # traffic is on its way: load it now
                        self.background(warm_logged(scheduler))
                entry.left_at.pop(version, None)
            now = self.clock.now()
            for version in entry.routing.traffic:
                if version not in routing.traffic:
                    entry.left_at[version] = now
        finally:  # (a version read failed: what changed before it still counts)
            self.rollbacks.note(entry)
        if entry.routing.primary != routing.primary:
            log.info("%s: %s now serves %s", entry.name, routing.primary, dict(routing.traffic))
        entry.routing, entry.etag = routing, etag

    async def watch(self) -> list[str]:
        """Apply routing changed in the store (another node's deploy, ``fnrt deploy
        --store``): one conditional GET of the change feed, then a read of each
        function it names that is served here. The names of those that changed."""
        position = self.feed.position
        targets = await self.feed.moved(self._functions, self.lookups.stored)
        changed: list[str] = []
        try:
            for entry in targets or ():
                try:
                    if await self.refresh(entry):
                        changed.append(entry.name)
                except FunctionNotFound:
                    await self.forget(entry.name)
                    changed.append(entry.name)
        except BaseException:
            self.feed.rewind(position)  # read again next time
            raise
        return changed

    def hold(self, entry: ServedFunction, version: str, scheduler: Scheduler | None) -> None:
        """Make ``scheduler`` the one ``entry`` holds for ``version`` (None: hold none),
        closing in the background the one it held before, if another. A deploy's
        candidate that became the version's, or failed its checks."""
        held = entry.schedulers.pop(version, None)
        if scheduler is not None:
            entry.schedulers[version] = scheduler
        if held is not None and held is not scheduler:
            self.background(sched.close(held))

    def retire(self, entry: ServedFunction, version: str) -> bool:
        """``version``'s rollback window passed: forget when it left, and close its
        scheduler (it finishes what it accepted) unless it has traffic again. Whether
        one was closed."""
        entry.left_at.pop(version, None)
        self.rollbacks.note(entry)
        if version in entry.routing.traffic or version not in entry.schedulers:
            return False
        self.hold(entry, version, None)
        return True

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(self.repository.delete_function, name)
        self.lookups.stored([name])  # what was kept of it (its versions' list, manifests)
        await self.forget(name)

    async def forget(self, name: str) -> None:
        entry = self._functions.pop(name, None)
        if entry is None:
            return  # a canary of it stops at its next step (Deployer: is_current)
        self.rollbacks.forget(name)
        await asyncio.gather(*(sched.close(s) for s in entry.schedulers.values()))
        self._schedulers.events.deleted(name)
        if self._keeper is not None:
            self._keeper.forget(name)

    # --- what it holds (the admin views of it are views.py's) -----------------------

    def loaded(self) -> list[Scheduler]:
        """Every version scheduler on this node: primary versions first."""
        primaries = [e.primary for e in self._functions.values()]
        rest = [
            s for e in self._functions.values() for s in e.schedulers.values() if s is not e.primary
        ]
        return [*primaries, *rest]

    def versions_of(self, name: str) -> list[Scheduler]:
        """The schedulers this node has for ``name`` (the primary first)."""
        entry = self._functions.get(name)
        if entry is None:
            return []
        return [entry.primary, *(s for s in entry.schedulers.values() if s is not entry.primary)]


async def warm_logged(scheduler: Scheduler) -> None:
    try:
        await sched.warm(scheduler)
    except Exception as exc:
        log.error("preloading %s failed: %s", scheduler.name, exc)


def starting(
    repository: Repository,
    keeper: Planned | None,
    imports_seen: Callable[[Iterable[str]], object] | None,
    preload: bool,
) -> tuple[list[str], list[str]]:
    """The functions the store holds, and those served from the start (blocking: store
    reads)."""
    names = repository.list_functions()
    if preload:
        return names, names
    chosen = []
    for name in names:
        if keeper is not None and keeper.knows(name):
            chosen.append(name)
            continue
        try:
            routing, _ = repository.get_routing(name)
            stored = repository.read_version(name, routing.primary)
        except FunctionNotFound:
            continue  # deleted meanwhile
        except Exception as exc:
            log.error("cannot serve %s: %s", name, exc)
            continue
        imports = stored.get("imports")
        environment = stored["manifest"].get("environment")
        if isinstance(environment, dict) and environment.get("requirements"):
            imports = None  # run with packages of its own: not the server's spares'
        if imports_seen is not None and isinstance(imports, list):
            imports_seen(n for n in imports if isinstance(n, str) and n.isidentifier())
        scaling = stored["manifest"].get("scaling")
        if isinstance(scaling, dict) and scaling.get("load_at_start") is True:
            chosen.append(name)  # checked in full when it is served, below
    return names, chosen
