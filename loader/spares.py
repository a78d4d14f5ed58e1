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
second) do not compete with the cold start they would slow.

Which modules: those the user names (``fnrt serve --worker-imports``), those
the code of the functions this node serves imports from the installed packages
(read at each version's deploy and kept with it: :mod:`fnrt.loader.imports`;
learned when the node starts on the store, or first serves the version), and
those every load on this node reported importing
(:func:`fnrt.loader.worker.installed_imports`); a spare started before a
module was learned is replaced by one that has it. What was learned is kept
in a file (``remembered``, in the node's cache folder), so a node started
again on the same cache starts its spares with the server instead of after
its first cold start. A function with an ``[environment]`` gets a worker of
its own: its modules may differ.

Spares are started on a thread of their own that lives as long as the node:
a worker asks Linux to kill it when the thread that started it ends
(``PR_SET_PDEATHSIG`` follows the thread, not the process).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fnrt.loader.imports import installed
from fnrt.loader.stores.file import write_atomic

log = logging.getLogger("fnrt.loader")

#: The most module names a spare imports (the learned ones are top-level names only).
MAX_IMPORTS = 64
#: How long after a cold start's load its replacement spare starts: its first batch
#: runs meanwhile (in one measured run, spares started at once made that batch up to
#: 10 ms slower on 2 cores).
REFILL_DELAY_S = 1.0


@dataclass(frozen=True)
class Started:
    """A worker process just started, and the server's end of its socket."""

    process: subprocess.Popen[bytes]
    sock: socket.socket
    imports: frozenset[str]


def start_worker(env: Mapping[str, str] | None, imports: Iterable[str] | None = None) -> Started:
    """Start ``python -m fnrt.loader.worker`` waiting for its load message on a socket
    pair: a spare when ``imports`` is given (it imports them and rehearses a cold start
    first), else a worker for a load now."""
    ours, theirs = socket.socketpair()
    names = sorted(imports) if imports is not None else []
    argv = [sys.executable, "-m", "fnrt.loader.worker", str(theirs.fileno()), str(os.getpid())]
    if imports is not None:
        argv += ["--spare", ",".join(names)]
    try:
        process = subprocess.Popen(
            argv, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return Started(process, ours, frozenset(names))


def end(started: Started) -> None:
    """End a worker that was never given a function (its socket closed, it exits)."""
    started.sock.close()
    try:
        started.process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        started.process.kill()
        started.process.wait()


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


class SpareWorkers:
    """Up to ``count`` workers of the server's environment, started ahead."""

    def __init__(
        self,
        count: int,
        imports: Iterable[str] = (),
        *,
        refill_delay_s: float = REFILL_DELAY_S,
        remembered: Path | None = None,
    ) -> None:
        if count < 0:
            raise ValueError("count: must be >= 0")
        self.count = count
        self.named = frozenset(imports)  # what the user asked for
        self.remembered = remembered  # where what was learned is kept
        self.learned: set[str] = set(_recall(remembered)) - self.named  # what handlers imported
        self.taken = 0  # cold starts that took a spare
        self.refill_delay_s = refill_delay_s
        self._spares: list[Started] = []
        self._lock = threading.Lock()
        self._closed = False
        self._closing = threading.Event()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="fnrt-spares")

    @property
    def imports(self) -> frozenset[str]:
        """The modules a spare started now imports."""
        learned = sorted(self.learned)[: max(MAX_IMPORTS - len(self.named), 0)]
        return self.named | frozenset(learned)

    def take(self) -> Started | None:
        """A live spare (no longer this pool's), or None when none is ready."""
        with self._lock:
            while self._spares:
                spare = self._spares.pop(0)
                if spare.process.poll() is None:
                    self.taken += 1
                    return spare
                log.warning(
                    "spare worker %d exited with %s", spare.process.pid, spare.process.returncode
                )
                spare.sock.close()
        return None

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
        ends while the node stops)."""
        with self._lock:
            if not self._closed:
                return self._thread.submit(self._refill, 0.0 if now else self.refill_delay_s)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _refill(self, delay_s: float) -> None:
        if delay_s > 0 and self._closing.wait(delay_s):
            return
        stale: list[Started] = []
        with self._lock:
            if self._closed:
                return
            wanted = self.imports
            keep = [s for s in self._spares if s.imports >= wanted and s.process.poll() is None]
            stale = [s for s in self._spares if s not in keep]
            self._spares = keep
            missing = self.count - len(keep)
        for spare in stale:
            end(spare)
        for _ in range(missing):
            try:
                started = start_worker(None, wanted)
            except OSError as exc:
                log.warning("cannot start a spare worker: %s", exc)
                return
            with self._lock:
                if self._closed:
                    end(started)
                    return
                self._spares.append(started)

    @property
    def ready(self) -> int:
        with self._lock:
            return sum(1 for s in self._spares if s.process.poll() is None)

    def close(self) -> None:
        """End the spares and their thread (after every taken one has ended: a worker's
        life is tied to the thread that started it)."""
        with self._lock:
            self._closed = True
            spares, self._spares = self._spares, []
        self._closing.set()
        for spare in spares:
            end(spare)
        self._thread.shutdown(wait=True)
