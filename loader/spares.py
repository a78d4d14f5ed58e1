"""Spare workers: processes started ahead of a cold start, their imports done.

In process isolation a cold start starts a worker: a new Python that imports
fnrt's worker side and then the handler, whose framework is most of the wait
(torch: about a second, against some 30 ms to map 256 MiB of weights and run
them once). :class:`SpareWorkers` keeps ``count`` workers started ahead, each
waiting for its first message with the modules handlers on this node imported
already imported and a cold start rehearsed (``python -m fnrt.loader.worker FD
PPID --spare a,b``: :func:`fnrt.loader.worker.rehearse`). A
cold start of a function in the server's own environment takes one (it only
maps its weights and imports its own code) and the spare is replaced a
second after that load (``REFILL_DELAY_S``), not during it nor during the
first batch that follows it, so the replacement's imports (a core for a
second) do not compete with the cold start they would slow. A replacement
(a refill nobody waits for) imports at the lowest CPU priority
(``--nice``, :mod:`fnrt.loader.priority`), so its imports take only what
serving leaves while the node is busy, as it is right after a cold start; a
spare a deploy or the node's start waits for imports at the server's. A cold
start or a deploy that finds a replacement still warming raises it back
first, where Linux allows (``CAP_SYS_NICE`` or ``RLIMIT_NICE``); where it
does not, a cold start does not wait for it and starts a worker of its own.

Which modules: those the user names (``fnrt serve --worker-imports``), those
the code of the functions this node serves imports from the installed packages
(read at each version's deploy and kept with it: :mod:`fnrt.loader.imports`;
learned when the node starts on the store, or first serves the version), and
those every load on this node reported importing
(:func:`fnrt.loader.worker.installed_imports`); a spare started before a
module was learned is replaced by one that has it. What was learned is kept
in a file (``remembered``, in the node's cache folder), so a node started
again on the same cache starts its spares with the server instead of after
its first cold start.

A function with an ``[environment]`` runs in workers whose path starts with
that environment's packages, so the server's spares do not serve it. Its
environment keeps ``count`` spares of its own once this node serves a version
in it with the environment built here (:meth:`SpareWorkers.expect_environment`:
at its deploy to this node, say), or once a cold start in it has run here
(:meth:`SpareWorkers.learn_environment`), importing what the version's code
imports and what those loads reported, from the environment's packages or the
node's. The ``MAX_ENVIRONMENTS`` environments used last keep theirs; an older
one's spares are ended. Nothing of them is remembered across restarts.

A spare says when its imports and rehearsal are done (a byte on a pipe of its
own, ``--ready FD``): :meth:`Started.wait_ready`. A cold start that takes a
spare still warming waits for it there, so that wait is its ``worker_s``
("waiting for a worker"), not hidden in the load's round trip. A deploy waits
(:meth:`SpareWorkers.ready_for`, bounded) until a spare importing what the
version's code imports is ready, so that the version's first call finds one
however soon it comes, and however many deploys came just before.

Spares are started on a thread of their own that lives as long as the node:
a worker asks Linux to kill it when the thread that started it ends
(``PR_SET_PDEATHSIG`` follows the thread, not the process).
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fnrt.loader.descendants import with_token
from fnrt.loader.environment import Environment
from fnrt.loader.imports import installed, installed_in
from fnrt.loader.priority import LOW_NICE, restore, set_group_nice
from fnrt.loader.stores.file import write_atomic

log = logging.getLogger("fnrt.loader")

#: The most module names a spare imports (the learned ones are top-level names only).
MAX_IMPORTS = 64
#: How long after a cold start's load its replacement spare starts: its first batch
#: runs meanwhile (in one measured run, spares started at once made that batch up to
#: 10 ms slower on 2 cores).
REFILL_DELAY_S = 1.0
#: The longest a cold start waits for the spare it took to finish its imports (past it,
#: the load message waits in its socket meanwhile).
TAKE_WAIT_S = 60.0
#: How long a deploy's first call is waited for: until then (or until a cold start takes
#: a spare), the server's spares are kept at one for each deploy awaiting its first call,
#: when that is more than ``count``, so that deploys one right after another, called only
#: after, each find one.
AHEAD_S = 120.0
#: The most deploys awaiting their first call that get a spare each (each spare is an
#: interpreter with the frameworks imported: hundreds of MB with torch).
MAX_AHEAD = 4
#: How many ``[environment]``s keep spares of their own: those used last (a version in
#: it served, a cold start in it; each spare is an interpreter with its framework imported).
MAX_ENVIRONMENTS = 2


@dataclass(eq=False)
class Started:
    """A worker process just started, and the server's end of its socket."""

    process: subprocess.Popen[bytes]
    sock: socket.socket
    imports: frozenset[str]
    #: a spare's pipe, readable once its imports and rehearsal are done (None: they are,
    #: or it is no spare)
    ready_fd: int | None = None
    #: how far below the server's priority a spare's imports run (0: at it)
    nice: int = 0
    _waiting: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _forgotten: bool = field(default=False, repr=False)  # ended while someone waited

    @property
    def warming(self) -> bool:
        """Whether it is a spare whose imports and rehearsal are not known to be done."""
        return self.ready_fd is not None

    def hurry(self) -> bool:
        """Whether it runs at the server's priority now, or is warm: a spare started at
        a low one is raised back where Linux allows it (``priority.py``; its session's
        group always: a warm one raised it itself, unless the kernel kept refusing)."""
        if not self.nice:
            return True
        return restore(self.process.pid) or not self.warming

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until its imports and rehearsal are done, or it ended; whether that was
        within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        if self.ready_fd is None:
            return True
        if not self._waiting.acquire(timeout=max(timeout_s, 0.0)):
            return False
        try:
            fd = self.ready_fd
            if fd is None:
                return True
            left = max(deadline - time.monotonic(), 0.0)
            poller = select.poll()  # not select(): a busy process's fds pass 1023
            poller.register(fd, select.POLLIN)
            if not poller.poll(left * 1000):
                return False
            self.ready_fd = None
            os.close(fd)  # a byte (ready) or the end of the pipe (it exited): done either way
            return True
        finally:
            if self._forgotten and self.ready_fd is not None:
                os.close(self.ready_fd)
                self.ready_fd = None
            self._waiting.release()

    def forget_ready(self) -> None:
        """Close its pipe (it ends unused); never waits for one waiting on it (that one
        closes it when its wait ends)."""
        if not self._waiting.acquire(blocking=False):
            self._forgotten = True
            return
        try:
            fd, self.ready_fd = self.ready_fd, None
        finally:
            self._waiting.release()
        if fd is not None:
            os.close(fd)


def start_worker(
    env: Mapping[str, str] | None,
    imports: Iterable[str] | None = None,
    site: Path | None = None,
    *,
    nice: int = 0,
) -> Started:
    """Start ``python -m fnrt.loader.worker`` waiting for its load message on a socket
    pair: a spare when ``imports`` is given (it imports them and rehearses a cold start
    first), else a worker for a load now. ``env``: its environment variables (None:
    the server's); ``site``: the folder of its ``[environment]``'s packages, first on
    its path, whose modules its load reports as installed too; ``nice``: a spare's
    imports run on a thread that much below its priority (its main thread, which
    serves, stays at the server's)."""
    ours, theirs = socket.socketpair()
    names = sorted(imports) if imports is not None else []
    argv = [sys.executable, "-m", "fnrt.loader.worker", str(theirs.fileno()), str(os.getpid())]
    passed = [theirs.fileno()]
    ready: int | None = None
    if imports is not None:  # a spare: it says on a pipe when it is warm
        ready, said = os.pipe()
        passed.append(said)
        argv += ["--spare", ",".join(names), "--ready", str(said)]
        if nice:
            argv += ["--nice", str(nice)]
    if site is not None:
        argv += ["--site", str(site)]
    try:
        # a session and group of its own, and a token its descendants inherit: what
        # it and its keeper find them by, to end them with it (descendants.py)
        process = subprocess.Popen(
            argv,
            pass_fds=passed,
            stdin=subprocess.DEVNULL,
            env=with_token(env),
            start_new_session=True,
        )
    except BaseException:
        ours.close()
        if ready is not None:
            os.close(ready)
        raise
    finally:
        theirs.close()
        if ready is not None:
            os.close(passed[1])  # the worker's end of the pipe
    if imports is not None and nice:  # its interpreter's start too (priority.py)
        set_group_nice(process.pid, min(nice, LOW_NICE))
    return Started(process, ours, frozenset(names), ready, nice if imports is not None else 0)


def end(started: Started) -> None:
    """End a worker that was never given a function (its socket closed, it exits)."""
    started.forget_ready()
    started.sock.close()
    try:
        started.process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        started.process.kill()
        started.process.wait()


def _end_all(spares: Iterable[Started]) -> None:
    for spare in spares:
        end(spare)


def _recall(path: Path | None) -> list[str]:
    """The module names kept at ``path`` (none when it is missing or unreadable)."""
    if path is None or not path.exists():
        return []
    try:
        names = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return []
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and n.isidentifier()]


@dataclass(eq=False)  # one per environment: compared by identity
class _Environment:
    """The spares of one ``[environment]`` and what they import."""

    built: Environment
    learned: set[str] = field(default_factory=set)
    spares: list[Started] = field(default_factory=list)

    @property
    def imports(self) -> frozenset[str]:
        return frozenset(sorted(self.learned)[:MAX_IMPORTS])


class SpareWorkers:
    """Up to ``count`` workers of the server's environment started ahead, and as many
    of each of the ``MAX_ENVIRONMENTS`` ``[environment]``s used last here."""

    def __init__(
        self,
        count: int,
        imports: Iterable[str] = (),
        *,
        refill_delay_s: float = REFILL_DELAY_S,
        remembered: Path | None = None,
        replacement_nice: int = LOW_NICE,
    ) -> None:
        if count < 0:
            raise ValueError("count: must be >= 0")
        self.count = count
        self.named = frozenset(imports)  # what the user asked for
        self.remembered = remembered  # where what was learned is kept
        self.learned: set[str] = set(_recall(remembered)) - self.named  # what handlers imported
        self.taken = 0  # cold starts that took a spare
        self.refill_delay_s = refill_delay_s
        #: how far below the server's priority a replacement's imports run (0: at it)
        self.replacement_nice = replacement_nice
        self._spares: list[Started] = []
        #: by environment key, the least recently used first
        self._environments: OrderedDict[str, _Environment] = OrderedDict()
        self._lock = threading.Lock()
        self._added = threading.Condition(self._lock)  # a spare joined a pool
        self._closed = False
        self._closing = threading.Event()
        self._hurry = threading.Event()  # a refill wanted now: the delayed one waits no more
        self._ahead: list[float] = []  # deploys awaiting their first call: until when
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="fnrt-spares")

    @property
    def imports(self) -> frozenset[str]:
        """The modules a spare started now imports."""
        learned = sorted(self.learned)[: max(MAX_IMPORTS - len(self.named), 0)]
        return self.named | frozenset(learned)

    def take(self, environment: str | None = None) -> Started | None:
        """A live spare (no longer this pool's) of the server's environment, or of the
        ``[environment]`` of that key, once its imports are done (waited for, up to
        ``TAKE_WAIT_S``: the cold start's wait for a worker); None when there is none, or
        when the only one is a replacement still warming at a low priority that cannot be
        raised back here (it stays, for a later cold start; none is started so where the
        node may not raise a thread's priority back: ``priority.may_raise``)."""
        taken = None
        with self._lock:
            if environment is None:
                spares = self._spares
            elif environment in self._environments:
                spares = self._environments[environment].spares
            else:
                return None
            spares.sort(key=lambda s: (s.warming, s.nice))  # a warm one first
            while spares:
                spare = spares.pop(0)
                if spare.process.poll() is None:
                    if not spare.hurry():  # its imports would crawl behind the serving
                        spares.insert(0, spare)
                        return None
                    self.taken += 1
                    if environment is None and self._ahead:  # a deploy's first call, say
                        self._ahead.pop(0)
                    taken = spare
                    break
                log.warning(
                    "spare worker %d exited with %s", spare.process.pid, spare.process.returncode
                )
                spare.forget_ready()
                spare.sock.close()
        if taken is not None:
            taken.wait_ready(TAKE_WAIT_S)
        return taken

    def ready_for(self, modules: Iterable[str], timeout_s: float, *, ahead: bool = True) -> bool:
        """Make a spare ready for a version (just deployed) whose code imports
        ``modules`` (those installed here), now: learned, the spares brought up to date
        at once (one for each deploy awaiting its first call, ``AHEAD_S``, when that is
        more than ``count``), and waited for until they import them and have done their
        imports and rehearsal. Whether they had, within ``timeout_s`` (False at once
        with no spares to keep, or when one cannot start). ``ahead``: the version awaits
        its first cold start (not so when its deploy loaded it: the spares are then
        only brought up to ``count``). Blocking: a deploy calls it off the event loop."""
        self.learn(m for m in modules if installed(m))
        if not self.count:
            return False
        deadline = time.monotonic() + timeout_s
        with self._lock:
            now = time.monotonic()
            if ahead:
                self._ahead = [t for t in self._ahead if t > now][-(MAX_AHEAD - 1) :]
                self._ahead.append(now + AHEAD_S)
        filled = self.refill(now=True)
        while True:
            with self._lock:
                wanted, target = self.imports, self._target()
                found = [
                    s for s in self._spares if s.imports >= wanted and s.process.poll() is None
                ]
                if len(found) < target:
                    left = deadline - time.monotonic()
                    if self._closed or left <= 0 or filled.done():  # done short: it failed
                        return False
                    self._added.wait(min(left, 0.5))
                    continue
            for spare in found[:target]:
                spare.hurry()  # a replacement warming at a low priority: waited for now
            return all(
                s.wait_ready(deadline - time.monotonic()) and s.process.poll() is None
                for s in found[:target]
            )

    def _target(self) -> int:
        """(Lock held.) How many spares the server's environment keeps now: ``count``,
        or one for each deploy awaiting its first call when that is more."""
        now = time.monotonic()
        self._ahead = [t for t in self._ahead if t > now]
        return max(self.count, min(len(self._ahead), MAX_AHEAD)) if self.count else 0

    def learn(self, modules: Iterable[str]) -> bool:
        """Modules a load reported importing, or a version's code imports: spares
        started from now import them too (and a node started again on this cache, from
        its start). Whether any was new."""
        with self._lock:
            new = {m for m in modules if m not in self.named} - self.learned
            if not new:
                return False
            self.learned |= new
            names = sorted(self.learned)
        if self.remembered is not None:
            try:
                write_atomic(self.remembered, [json.dumps(names).encode()])
            except OSError as exc:  # a full or read-only disk: remembered next time, maybe
                log.warning("cannot keep the spare workers' imports: %s", exc)
        return True

    def learn_environment(self, built: Environment, modules: Iterable[str]) -> bool:
        """A cold start in the ``[environment]`` ``built`` imported ``modules`` (or a
        version served in it will): it keeps spares of its own from now (started by
        :meth:`refill`), and the spares of the least recently used beyond
        ``MAX_ENVIRONMENTS`` end. Whether it or any of the modules was new."""
        with self._lock:
            if self._closed or not self.count:
                return False
            environment = self._environments.pop(built.key, None)
            new = environment is None
            if environment is None:
                environment = _Environment(built)
            before = len(environment.learned)
            environment.learned.update(modules)
            self._environments[built.key] = environment  # the latest last
            dropped: list[Started] = []
            while len(self._environments) > MAX_ENVIRONMENTS:
                dropped += self._environments.popitem(last=False)[1].spares
            if dropped:  # ended on the spares' thread: an end may wait for the exit
                self._thread.submit(_end_all, dropped)
            return new or len(environment.learned) > before

    def expect_environment(self, built: Environment, modules: Iterable[str]) -> None:
        """A version served here runs in the ``[environment]`` ``built`` (built on this
        node) and its code imports ``modules``: that environment keeps spares importing
        those installed in it or here, brought up to date after ``refill_delay_s``, so
        that its first cold start finds one ready."""
        found = [m for m in modules if installed_in(m, built.site) or installed(m)]
        if self.learn_environment(built, found):
            self.refill()

    def expect(self, modules: Iterable[str], *, refill: bool = True) -> None:
        """A function this node serves imports ``modules`` (read from its code at its
        deploy, maybe elsewhere): learn those installed here, and when any is new
        (and ``refill``), bring the spares up to date after ``refill_delay_s``, so
        that its first cold start finds one ready."""
        if self.learn(m for m in modules if installed(m)) and refill:
            self.refill()

    @property
    def known(self) -> bool:
        """Whether anything is known to import ahead (named, or learned before): then
        spares are worth starting with the server."""
        return bool(self.named or self.learned)

    def refill(self, *, now: bool = False) -> Future[None]:
        """Bring the spares to ``count`` (on the spares' own thread, not the caller's),
        replacing any that lacks a module learned since it started, after
        ``refill_delay_s`` unless ``now``; after :meth:`close`, nothing (a load that
        ends while the node stops). Spares started by a refill that is not ``now`` (and
        no ``now`` one came meanwhile) import at the lowest priority (``LOW_NICE``):
        nobody waits for them, and the node is serving."""
        with self._lock:
            if not self._closed:
                if now:
                    self._hurry.set()  # a delayed refill queued before it runs now
                return self._thread.submit(self._refill, 0.0 if now else self.refill_delay_s, now)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _refill(self, delay_s: float, now: bool) -> None:
        if delay_s > 0:
            self._hurry.wait(delay_s)
        waited_for = now or self._hurry.is_set()  # a deploy or the node's start waits
        if delay_s <= 0:
            self._hurry.clear()
        nice = 0 if waited_for else self.replacement_nice
        if self._closing.is_set():
            return
        with self._lock:
            environments = list(self._environments.values())
        for environment in (None, *environments):
            if not self._fill(environment, nice):
                return

    def _fill(self, environment: _Environment | None, nice: int = 0) -> bool:
        """Bring the spares of the server's environment (None) or of ``environment`` up
        to date; False once the pool is closed or a worker cannot start."""
        with self._lock:
            if self._closed:
                return False
            spares = self._spares if environment is None else environment.spares
            wanted = self.imports if environment is None else environment.imports
            keep = [s for s in spares if s.imports >= wanted and s.process.poll() is None]
            target = self._target() if environment is None else self.count
            keep = keep[:target]  # past it: the spares of deploys not called in time, ended
            stale = [s for s in spares if s not in keep]
            spares[:] = keep
            missing = target - len(keep)
        for spare in stale:
            end(spare)
        for _ in range(missing):
            try:
                if environment is None:
                    started = start_worker(None, wanted, nice=nice)
                else:
                    built = environment.built
                    variables = built.worker_variables()
                    started = start_worker(variables, wanted, built.site, nice=nice)
            except OSError as exc:
                log.warning("cannot start a spare worker: %s", exc)
                return False
            with self._lock:
                # closed, or its environment gave up its spares meanwhile: not wanted
                wanted_still = not self._closed and (
                    environment is None
                    or any(e is environment for e in self._environments.values())
                )
                if wanted_still:
                    spares.append(started)
                    self._added.notify_all()
            if not wanted_still:
                end(started)
                return not self._closed
        return True

    @property
    def ready(self) -> int:
        """Live spares, of every environment."""
        with self._lock:
            pools = [self._spares, *(e.spares for e in self._environments.values())]
            return sum(1 for spares in pools for s in spares if s.process.poll() is None)

    def close(self) -> None:
        """End the spares and their thread (after every taken one has ended: a worker's
        life is tied to the thread that started it)."""
        with self._lock:
            self._closed = True
            spares, self._spares = self._spares, []
            for environment in self._environments.values():
                spares += environment.spares
            self._environments.clear()
        self._closing.set()
        self._hurry.set()
        with self._lock:
            self._added.notify_all()
        for spare in spares:
            end(spare)
        self._thread.shutdown(wait=True)
