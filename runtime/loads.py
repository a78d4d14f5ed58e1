"""Loading one version's instances: backoff, room in the memory budgets, the load itself.

A load runs on a new executor's one thread (the instance's thread from then
on), after the slot's backoff if its last loads failed or its instances kept
dying, and after the memory budgets made room for what the last load held. The
node's own load (``fnrt.loader.launch.Launch``) readies its files first (and a
worker's environment): a store that fails then evicts nothing for it. A
failure of the store or the manifest is raised as it is; the handler's own
failure is logged with an error id, counted, and makes the next load of the
slot wait the backoff (:meth:`Loads.failed`, which also tells ``died``: the
breaker counts deaths in a row). The pool owns the slots and sets the instance
this returns; this part owns the loads' stats, events and log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Protocol

from fnrt.functions.errors import FnrtError, InstanceLost, LoadError, Unavailable
from fnrt.functions.version import VersionManifest
from fnrt.loader.instance import Prepared, Runnable
from fnrt.loader.launch import Launch
from fnrt.loader.memory import MakeRoom, no_room
from fnrt.loader.process import ProcessInstance
from fnrt.loader.scrub import Watch
from fnrt.runtime.clock import Clock
from fnrt.runtime.collector import COLLECTOR, empty_device_cache
from fnrt.runtime.events import Events
from fnrt.runtime.stats import Stats

log = logging.getLogger("fnrt.pool")

#: Builds one instance of a version on the executor's thread (``launch`` by default).
LoadInstance = Callable[[VersionManifest, Executor], Runnable]


class Backoff(Protocol):
    """A slot as its loads see it: its index and its record of failures in a row."""

    @property
    def index(self) -> int: ...

    failures: int  # loads failed or instances lost in a row
    retry_at: float  # no load before this clock time (backoff)
    backing_off: bool  # its load is waiting out the backoff


def new_error_id() -> str:
    return uuid.uuid4().hex[:16]


def describe_failure(exc: BaseException) -> str:
    """``Type: message`` of a handler's exception (a worker's arrives that way already)."""
    reason = getattr(exc, "reason", None)
    return reason if isinstance(reason, str) else f"{type(exc).__name__}: {exc}"


def remote_traceback(exc: BaseException) -> str:
    """A worker's traceback of ``exc`` to append to a log line ("" for local errors)."""
    text = getattr(exc, "remote_traceback", "")
    return f"\nin the worker:\n{text}" if text else ""


async def _prepared(launch: Launch, version: VersionManifest, executor: Executor) -> Prepared:
    """``launch.prepare(version)`` on ``executor``'s thread; when this is cancelled while it
    runs, what it readies is given back once it has (its files unpinned)."""
    future = asyncio.wrap_future(executor.submit(launch.prepare, version))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:

        def give_back(done: asyncio.Future[Prepared]) -> None:
            if not done.cancelled() and done.exception() is None:
                launch.give_back(done.result())

        future.add_done_callback(give_back)
        raise


def _announce(sent: asyncio.Future[Runnable], instance: ProcessInstance) -> None:
    """Set ``sent`` (from the load's thread) to the instance its load message went to."""
    with contextlib.suppress(RuntimeError):  # the loop has ended: nobody waits for it
        sent.get_loop().call_soon_threadsafe(_resolve, sent, instance)


def _resolve(sent: asyncio.Future[Runnable], instance: ProcessInstance) -> None:
    if not sent.done():
        sent.set_result(instance)


#: What a load's thread made: the instance, the watch on its files, what the watch raised.
Made = tuple[Runnable, Watch | None, Exception | None]


def _watched(load: Callable[[], Runnable], watch: Callable[[], Watch | None]) -> Made:
    """``load()``, then ``watch()`` on the same thread (one hop back to the event loop for
    both), and what the watch raised: the caller closes the instance then (a thread
    instance's close runs its ``unload`` on this very thread)."""
    instance = load()
    try:
        return instance, watch(), None
    except Exception as exc:
        return instance, None, exc


def _close_made(executor: ThreadPoolExecutor, made: Future[Made]) -> None:
    """What a cancelled load's thread made (an instance, a worker of which would run on;
    the watch it registered with the scrub), closed once it is done, and the load's
    executor shut down after: on a thread of its own (a thread instance's ``unload``
    runs on that executor), with no event loop (it may have ended: a node that stops)."""

    def close() -> None:
        if not made.cancelled() and made.exception() is None:
            instance, watch, _ = made.result()
            if watch is not None:
                watch.close()
            release_instance(instance)
        executor.shutdown(wait=False)

    threading.Thread(target=close, name="fnrt-close-cancelled", daemon=True).start()


def release_instance(instance: Runnable) -> None:
    """Close an instance and, when its objects live in this process, have them collected
    (runs off the event loop).

    A thread instance's objects (its model's) were frozen after its load: what they
    hold in reference cycles is freed by a full collection (unfrozen first), which the
    unloads of a moment share (:mod:`fnrt.runtime.collector`; a load runs it first).
    A worker process's model goes with the process, and nothing was frozen here for
    it (``Loads.loaded``): no collection. (A full collection walks every object of
    the server, holding the GIL: it grows with every function a node has served.)
    """
    instance.close()
    if isinstance(instance, ProcessInstance):
        return
    del instance  # (closed, it holds nothing of the handler's: its model is freed now
    # by reference count, but for what it holds in cycles)
    empty_device_cache()
    COLLECTOR.unloaded()


class Loads:
    """The loads of one version's instances."""

    def __init__(
        self,
        version: VersionManifest,
        load: LoadInstance,
        clock: Clock,
        stats: Stats,
        events: Events,
        make_room: MakeRoom | None = None,
    ) -> None:
        self._version = version
        self._name = version.name
        self._load_instance = load
        #: the node's own load, in two steps (None: a load of one step, a test's say)
        self._launch = load if isinstance(load, Launch) else None
        self._clock = clock
        self._stats = stats
        self._events = events
        self._make_room = make_room
        #: Called when an instance died (its cause: ``signal``, ``timeout``...) or a load
        #: failed on the handler's side (``load``), with the clock time before which the
        #: slot loads none again (the backoff) and why: the breaker counts deaths in a row.
        self.died: Callable[[str, float, str], None] = lambda cause, retry_at, reason: None

    async def load(
        self,
        slot: Backoff,
        watch: Callable[[], Watch | None] = lambda: None,
        sent: asyncio.Future[Runnable] | None = None,
    ) -> tuple[Runnable, Watch | None, int, Callable[[], None]]:
        """A new instance for ``slot`` (after its backoff), the watch on its files that
        ``watch`` opened on the load's thread right after it (``FileWatches.open``), when
        its load started (``time.time_ns``, after the backoff), and what gives back the
        memory room held for it: call it once the instance is in its slot (its bytes
        counted there). A watch that fails to open fails the load (Unavailable: its
        instance is closed, and the slot does not back off: the node's files are at
        fault, not the handler); a load cancelled while its thread runs closes what
        that thread made once it is done. ``sent`` is set to a worker instance as soon as
        its load message is sent (a first batch may follow it: ``ProcessInstance.send_early``);
        it stays unset for a thread's load."""
        delay = slot.retry_at - self._clock.now()
        if delay > 0:  # backing off after failures
            slot.backing_off = True
            try:
                await self._clock.sleep(delay)
            finally:
                slot.backing_off = False
        started_ns = time.time_ns()
        executor = ThreadPoolExecutor(1, thread_name_prefix=f"fnrt-{self._name}-{slot.index}")
        loop = asyncio.get_running_loop()
        stats, version, launch = self._stats, self._version, self._launch
        release = no_room
        prepared: Prepared | None = None  # readied, not handed to its load yet
        handed_off = False  # the executor, to what closes a cancelled load's instance
        try:
            if launch is not None:  # its files (and environment) first: they hold no room
                prepared = await _prepared(launch, version, executor)
            if self._make_room is not None:
                key = f"{self._name}/{version.version}"
                extra = 0 if launch is None else launch.worker_bytes()  # a worker's own
                expected = stats.expected_bytes(version.size_bytes, extra)
                release = await self._make_room(key, *expected)
            if COLLECTOR.pending:  # what was unloaded (for room, say) is freed first
                await loop.run_in_executor(executor, COLLECTOR.settle)
            if launch is None or prepared is None:
                load = functools.partial(self._load_instance, version, executor)
            else:  # the load's pins from here
                on_sent = None if sent is None else functools.partial(_announce, sent)
                load = functools.partial(launch.load, version, executor, prepared, on_sent)
                prepared = None
            running = executor.submit(_watched, load, watch)
            try:
                instance, opened, unwatched = await asyncio.shield(asyncio.wrap_future(running))
            except asyncio.CancelledError:  # the thread goes on: what it makes is closed
                running.add_done_callback(functools.partial(_close_made, executor))
                handed_off = True
                raise
            if unwatched is not None:  # an instance whose files nothing watches: not served
                await asyncio.shield(asyncio.to_thread(release_instance, instance))
                why = describe_failure(unwatched)  # the node's files, not the handler: 503
                raise Unavailable(
                    f"function '{self._name}': the watch on its files could not start "
                    f"({why}); retry",
                    function=self._name,
                ) from unwatched
        except BaseException as exc:
            if launch is not None and prepared is not None:
                launch.give_back(prepared)  # never loaded: its files are unpinned
            release()  # the room goes back to the loads after it
            if not handed_off:
                executor.shutdown(wait=False)
            task = asyncio.current_task()
            if isinstance(exc, asyncio.CancelledError) and task and task.cancelling():
                raise  # stopped (the loop's end), not failed: no backoff, nothing logged
            stats.load_failures += 1
            if isinstance(exc, FnrtError) and not isinstance(exc, InstanceLost):
                stats.last_load_error = exc.message  # the store's or the manifest's: no backoff
                raise
            # the handler's own failure: the next load backs off
            self.failed(slot, "load", describe_failure(exc))
            error_id = new_error_id()
            log.error(
                "loading %s %s failed (error id %s)%s",
                self._name,
                self._version.version,
                error_id,
                remote_traceback(exc),
                exc_info=exc,
            )
            error = LoadError(self._name, error_id, describe_failure(exc))
            stats.last_load_error = error.message
            raise error from exc
        return instance, opened, started_ns, release

    def loaded(self, slot: Backoff, instance: Runnable, started_ns: int) -> None:
        """Count and tell a load that ended with ``instance`` in ``slot``."""
        stats = self._stats
        stats.last_load_error = None
        # A full collection walks every object torch and the model made (~100 ms
        # with torch loaded): freeze those of a model loaded here (a thread instance)
        # out of the collector so per-request garbage never triggers such a pause
        # (the p99 of a busy function). A worker's model lives in its process, which
        # freezes its own: nothing is frozen here for it, so its unload needs no
        # full collection of this process to free what was frozen (release_instance).
        if not isinstance(instance, ProcessInstance):
            COLLECTOR.freeze()
        stats.loads += 1
        stats.last_load_timings_s = dict(instance.timings_s)
        stats.last_load_tier = instance.tier
        stats.last_load_bytes = instance.size_bytes
        stats.last_load_device_bytes = instance.device_bytes
        stats.cold_starts[instance.tier] += 1
        self._events.loaded(self._version, instance, started_ns, time.time_ns())
        log.info(
            "loaded %s %s (instance %d, %s) in %.3fs",
            self._name,
            self._version.version,
            slot.index,
            instance.tier,
            instance.timings_s["total_s"],
        )

    def failed(self, slot: Backoff, cause: str, reason: str) -> None:
        """One more failure in a row: the next load of the slot waits the backoff."""
        slot.failures += 1
        slot.retry_at = self._clock.now() + self._version.manifest.isolation.backoff_s(
            slot.failures
        )
        self.died(cause, slot.retry_at, reason)
