"""The instance pool alone: no server, a manual clock, real instances of small handlers."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from fnrt.functions.errors import FnrtError, HandlerTimeout, LoadError, Unavailable
from fnrt.functions.handler import Request
from fnrt.functions.manifest import IsolationMode
from fnrt.functions.version import VersionManifest
from fnrt.loader.device import detect_device
from fnrt.loader.instance import Instance, InstanceLoader, Runnable
from fnrt.loader.launch import launch
from fnrt.loader.memory import Holders, MemoryBudget, room_maker
from fnrt.loader.process import ProcessInstance
from fnrt.loader.repository import Repository
from fnrt.loader.scrub import Watch
from fnrt.loader.staging import Staged
from fnrt.loader.stores import FileStore
from fnrt.runtime.clock import ManualClock
from fnrt.runtime.collector import COLLECTOR
from fnrt.runtime.events import NoEvents, StartKind
from fnrt.runtime.node import function_states
from fnrt.runtime.pool import InstancePool, InstanceState
from fnrt.runtime.stats import Stats
from support import ISOLATED_MANIFEST as ISOLATED
from support import MISBEHAVING_HANDLER as HANDLER
from support import packed, publish, write_function

ISOLATION = "\n[isolation]\ntimeout_s = {timeout_s}\nrestart_backoff_s = 2\n"
MANIFEST = """
name = "{name}"
handler = "handler:Echo"

[scaling]
keep_alive_s = 300
min_instances = 0
max_instances = 2
"""


def _vm(tmp_path: Path, timeout_s: float = 0) -> VersionManifest:
    folder = write_function(tmp_path, "p", manifest=MANIFEST + ISOLATION, timeout_s=timeout_s)
    return packed(folder)[0]


def _double(batch: list[Request]) -> Sequence[Any]:
    return [{"y": r["x"] * 2} for r in batch]


class Loads:
    """A load function: real instances whose handler is ``call``; counts its loads."""

    def __init__(
        self,
        call: Callable[[list[Request]], Sequence[Any]] = _double,
        fail: int = 0,
        gate: threading.Event | None = None,
    ) -> None:
        self.call, self.fail, self.count, self.gate = call, fail, 0, gate

    def __call__(self, vm: VersionManifest, executor: ThreadPoolExecutor) -> Instance:
        self.count += 1
        if self.gate is not None:
            self.gate.wait(10)
        if self.count <= self.fail:
            raise OSError("weights are corrupt")
        timings = {"fetch_s": 0.0, "verify_s": 0.0, "import_s": 0.0, "load_s": 0.0, "total_s": 0.0}
        return Instance(vm, self.call, executor, None, timings, 100)


def _pool(
    vm: VersionManifest, loads: Loads, clock: ManualClock, stats: Stats | None = None
) -> InstancePool:
    return InstancePool(vm, loads, clock, stats or Stats(), NoEvents(), in_thread=True)


X = {"x": np.ones((1, 4), np.float32)}


def test_concurrent_first_requests_share_one_load(tmp_path: Path) -> None:
    async def scenario() -> None:
        loads, clock = Loads(), ManualClock()
        pool = _pool(_vm(tmp_path), loads, clock)
        assert pool.starts.count(clock.now()) is StartKind.COLD
        first, second = await asyncio.gather(pool.ensure(pool.slots[0]), pool.ensure(pool.slots[0]))
        assert first is second and loads.count == 1
        assert pool.state is InstanceState.WARM and pool.instance_bytes == 100
        ran = await pool.run(pool.slots[0], first, [X])
        assert ran.results[0]["y"].tolist() == [[2, 2, 2, 2]]
        assert pool.starts.count(clock.now()) is StartKind.WARM
        await pool.close()
        assert pool.state is InstanceState.COLD

    asyncio.run(scenario())


def test_a_failed_load_backs_off_before_the_next(tmp_path: Path) -> None:
    async def scenario() -> None:
        loads, clock = Loads(fail=1), ManualClock()
        pool = _pool(_vm(tmp_path), loads, clock)
        slot = pool.slots[0]
        with pytest.raises(LoadError, match="OSError: weights are corrupt"):
            await pool.ensure(slot)
        assert slot.failures == 1 and slot.retry_at == clock.now() + 2
        again = asyncio.ensure_future(pool.ensure(slot))
        await asyncio.sleep(0.05)
        assert loads.count == 1 and pool.state is InstanceState.LOADING  # waiting out 2 s
        clock.advance(2)
        await again
        assert loads.count == 2 and pool.instances == 1
        await pool.close()

    asyncio.run(scenario())


def test_closing_does_not_wait_out_a_backoff(tmp_path: Path) -> None:
    async def scenario() -> None:
        loads, clock = Loads(fail=1), ManualClock()
        pool = _pool(_vm(tmp_path), loads, clock)
        with pytest.raises(LoadError):
            await pool.ensure(pool.slots[0])
        pool.load_in_background(pool.slots[0])  # waits 2 s of a clock nobody advances
        await asyncio.sleep(0.01)
        assert pool.slots[0].backing_off
        await asyncio.wait_for(pool.close(), 5)
        assert loads.count == 1 and pool.state is InstanceState.COLD

    asyncio.run(scenario())


def test_a_batch_past_its_timeout_replaces_the_instance(tmp_path: Path) -> None:
    release = threading.Event()

    def stuck(batch: list[Request]) -> Sequence[Any]:
        release.wait(30)
        return _double(batch)

    async def scenario() -> None:
        loads, clock, stats = Loads(stuck), ManualClock(), Stats()
        pool = _pool(_vm(tmp_path, timeout_s=0.2), loads, clock, stats)
        slot = pool.slots[0]
        instance = await pool.ensure(slot)
        with pytest.raises(HandlerTimeout):
            await pool.run(slot, instance, [X])
        assert slot.instance is None and not instance.alive
        assert dict(stats.restarts) == {"timeout": 1}
        assert slot.retry_at == clock.now() + 2  # the restart waits the backoff
        await asyncio.sleep(0.05)
        assert loads.count == 1
        clock.advance(2)
        for _ in range(100):
            if pool.instances:
                break
            await asyncio.sleep(0.01)
        assert loads.count == 2 and pool.instances == 1  # restarted without a request
        release.set()
        await pool.close()

    asyncio.run(scenario())


def test_idle_instances_stop_after_their_keep_alive(tmp_path: Path) -> None:
    async def scenario() -> None:
        loads, clock = Loads(), ManualClock()
        pool = _pool(_vm(tmp_path), loads, clock)
        await pool.ensure(pool.slots[0])
        clock.advance(299)
        assert not await pool.scale_to_zero(clock.now(), queued=0)
        assert not await pool.scale_to_zero(clock.now() + 1, queued=3)  # work is waiting
        clock.advance(1)
        assert await pool.scale_to_zero(clock.now(), queued=0)
        assert pool.instances == 0

    asyncio.run(scenario())


def test_the_pool_tells_when_it_starts_and_stops_holding_an_instance(tmp_path: Path) -> None:
    """What the node's memory budgets weigh (``Holders``): told once as the first instance
    comes and once as the last goes, by an unload or a loss alike."""
    release = threading.Event()

    def stuck_once(batch: list[Request]) -> Sequence[Any]:
        if not release.is_set():
            release.wait(30)
        return _double(batch)

    async def scenario() -> None:
        loads, clock = Loads(stuck_once), ManualClock()
        pool = _pool(_vm(tmp_path, timeout_s=0.2), loads, clock)
        told: list[bool] = []
        pool.holding = told.append
        await pool.ensure(pool.slots[0])
        assert pool.scale_up(queued=100, now=clock.now()) is None  # deep only since now
        extra = pool.scale_up(queued=100, now=clock.now() + 1)
        assert extra is not None
        await pool.ensure(extra)
        assert told == [True] and pool.instances == 2  # a second instance: nothing new
        clock.advance(300)
        assert await pool.scale_to_zero(clock.now(), queued=0)
        assert told == [True, False] and pool.instances == 0
        slot = pool.slots[0]
        instance = await pool.ensure(slot)
        with pytest.raises(HandlerTimeout):  # the instance is lost
            await pool.run(slot, instance, [X])
        assert told == [True, False, True, False]
        release.set()
        await pool.close()

    asyncio.run(scenario())


def test_a_load_under_way_counts_as_holding_until_it_fails(tmp_path: Path) -> None:
    async def scenario() -> None:
        loads, clock = Loads(fail=1), ManualClock()
        pool = _pool(_vm(tmp_path), loads, clock)
        told: list[bool] = []
        pool.holding = told.append
        with pytest.raises(LoadError):
            await pool.ensure(pool.slots[0])
        assert told == [True, False]  # loading, then cold again
        await pool.close()

    asyncio.run(scenario())


def test_closing_while_a_load_starts_its_watch_unloads_what_it_loaded(tmp_path: Path) -> None:
    """``close`` waits for a load until its instance is in its slot, the watch on its
    files started, and then unloads it. Before, a load whose watch was starting (a
    thread hop) put its instance into the closed pool: loaded, and held for good."""
    release = threading.Event()

    def watch_files(vm: VersionManifest) -> Watch | None:
        release.wait(10)
        return None

    async def scenario() -> None:
        loads, clock = Loads(), ManualClock()
        vm = _vm(tmp_path)
        pool = InstancePool(vm, loads, clock, Stats(), NoEvents(), watch_files=watch_files)
        told: list[bool] = []
        pool.holding = told.append
        loading = asyncio.ensure_future(pool.ensure(pool.slots[0]))
        for _ in range(200):  # the load is done; its watch is starting
            if loads.count:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        closing = asyncio.ensure_future(pool.close())
        await asyncio.sleep(0.05)
        release.set()
        await closing
        await loading
        assert pool.state is InstanceState.COLD and pool.instances == 0
        assert told == [True, False]

    asyncio.run(scenario())


def test_a_deep_queue_gets_another_slot_after_a_while(tmp_path: Path) -> None:
    async def scenario() -> None:
        loads, clock = Loads(), ManualClock()
        pool = _pool(_vm(tmp_path), loads, clock)
        assert len(pool.slots) == 1 and pool.slots[0].primary  # the pool made its first
        await pool.ensure(pool.slots[0])
        assert pool.scale_up(queued=100, now=clock.now()) is None  # deep only since now
        extra = pool.scale_up(queued=100, now=clock.now() + 1)
        assert extra is not None and pool.slots == [pool.slots[0], extra]
        await pool.ensure(extra)  # the load scale_up started
        assert loads.count == 2 and pool.instances == 2
        assert pool.scale_up(queued=100, now=clock.now() + 5) is None  # max_instances
        await pool.close()

    asyncio.run(scenario())


def test_an_extra_slot_whose_load_fails_is_given_up_by_the_pool(tmp_path: Path) -> None:
    """The queue's loop of an extra slot only ends when the pool gave the slot up: the
    pool alone changes its slots (#42 item 7)."""

    async def scenario() -> None:
        loads, clock = Loads(), ManualClock()
        pool = _pool(_vm(tmp_path), loads, clock)
        told: list[int] = []
        pool.changed = lambda: told.append(len(pool.slots))
        first = await pool.ensure(pool.slots[0])
        loads.fail = 2  # the next load fails
        pool.scale_up(queued=100, now=clock.now())
        extra = pool.scale_up(queued=100, now=clock.now() + 1)
        assert extra is not None
        with pytest.raises(LoadError):
            await pool.ensure(extra)
        assert extra.retired and len(pool.slots) == 1 and told == [1]
        assert pool.slots[0].instance is first  # the first serves on
        await pool.close()

    asyncio.run(scenario())


def test_a_gpu_with_no_room_for_another_instance_gets_none(tmp_path: Path) -> None:
    """``--gpu-concurrency``: the node's cap on instances sharing the GPU wins over a
    deep queue (the first instance is never refused: the cap is on scaling up)."""

    async def scenario() -> None:
        clock = ManualClock()
        room = [False]
        pool = InstancePool(
            _vm(tmp_path), Loads(), clock, Stats(), NoEvents(), device_room=lambda: room[0]
        )
        await pool.ensure(pool.slots[0])
        assert pool.scale_up(queued=100, now=clock.now()) is None
        assert pool.scale_up(queued=100, now=clock.now() + 5) is None
        room[0] = True
        assert pool.scale_up(queued=100, now=clock.now() + 6) is not None
        await pool.close()

    asyncio.run(scenario())


def test_a_worker_whose_file_watch_fails_to_start_is_stopped(tmp_path: Path) -> None:
    """The load started a worker process; starting the watch on its mapped files then
    raised (a blob gone before its record was read): the load fails (503, saying why)
    and the worker ends with it, not left running with no slot holding it."""
    repository = Repository(FileStore(tmp_path / "store"))
    fields = {"mode": "process", "timeout_s": 0, "memory_limit_bytes": 0}
    vm = publish(repository, write_function(tmp_path / "src", "w", HANDLER, ISOLATED, **fields))
    loader = InstanceLoader(repository, tmp_path / "cache", detect_device("cpu"))
    started: list[Runnable] = []

    def load(vm: VersionManifest, executor: ThreadPoolExecutor) -> Runnable:
        started.append(launch(loader, IsolationMode.PROCESS, vm, executor))
        return started[-1]

    def watch_files(vm: VersionManifest) -> Watch | None:
        raise FileNotFoundError("the blob went before its record was read")

    async def scenario() -> None:
        pool = InstancePool(vm, load, ManualClock(), Stats(), NoEvents(), watch_files=watch_files)
        with pytest.raises(Unavailable, match="the blob went before its record was read"):
            await pool.ensure(pool.slots[0])
        assert pool.slots[0].instance is None and pool.slots[0].loading is None
        await pool.close()

    asyncio.run(scenario())
    [instance] = started
    assert isinstance(instance, ProcessInstance)
    assert not instance.alive
    with pytest.raises(ProcessLookupError):  # ended and reaped
        os.kill(instance.pid, 0)
    assert not instance.workdir.exists()  # its arenas went with it


def test_a_batch_ending_on_an_instance_let_go_is_still_counted_running(tmp_path: Path) -> None:
    """A batch stopped while it runs leaves its slot running until the instance is let
    go (``abandon``, on a thread), after the pool has stopped holding it: the scrape's
    state (``node.function_states``) still counts that batch; the instance is gone."""

    async def scenario() -> None:
        started, let_go = threading.Event(), threading.Event()

        def slow(batch: list[Request]) -> Sequence[Any]:
            started.set()
            time.sleep(0.3)
            return _double(batch)

        pool = _pool(_vm(tmp_path), Loads(slow), ManualClock())
        holders = Holders()
        scheduler = SimpleNamespace(
            name="p", version=pool.version, pool=pool, batcher=SimpleNamespace(queued=0),
            sequencer=None,
        )  # fmt: skip
        pool.holding = functools.partial(holders.holding, scheduler)
        instance = await pool.ensure(pool.slots[0])
        abandon = instance.abandon

        def slow_abandon() -> None:  # a worker being killed and reaped, say
            let_go.wait(5)
            abandon()

        instance.abandon = slow_abandon  # type: ignore[method-assign]
        run = asyncio.ensure_future(pool.run(pool.slots[0], instance, [X]))
        while not started.is_set():
            await asyncio.sleep(0.01)
        pool.stop_running("unloaded while its batch ran")
        await asyncio.sleep(0.05)
        assert scheduler not in holders() and pool.running == 1
        (state,) = function_states([scheduler], holders())
        assert (state.warm_instances, state.running) == (0, 1)
        let_go.set()
        with pytest.raises(FnrtError):
            await run
        (state,) = function_states([scheduler], holders())
        assert (state.warm_instances, state.running) == (0, 0)
        await pool.close()

    asyncio.run(scenario())


class _Cyclic:
    """A model whose objects form a reference cycle (as a handler's may)."""

    def __init__(self) -> None:
        self.me = self

    def __call__(self, batch: list[Request]) -> Sequence[Any]:
        return _double(batch)


def _cyclic_loads(
    models: list[weakref.ref[_Cyclic]], before: Callable[[], None] = lambda: None
) -> Callable[[VersionManifest, ThreadPoolExecutor], Instance]:
    """A load function of thread instances whose model is a cycle ``models`` follows;
    ``before`` is called as each load starts."""

    def load(vm: VersionManifest, executor: ThreadPoolExecutor) -> Instance:
        before()
        model = _Cyclic()
        models.append(weakref.ref(model))
        return Instance(vm, model, executor, None, {"total_s": 0.0}, 100)

    return load


@contextlib.contextmanager
def _full_collections() -> Iterator[list[int]]:
    """The full collections (the oldest generation's) that run in the block, one entry
    each; the automatic ones are off meanwhile, so each counted was asked for."""
    full: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    gc.disable()
    gc.callbacks.append(seen)
    try:
        yield full
    finally:
        gc.callbacks.remove(seen)
        gc.enable()


def test_thread_instances_unloaded_together_share_one_collection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their objects were frozen out of the collector at their loads: one full collection
    frees what their models hold in cycles (which would otherwise stay in memory for the
    node's life), shared by the unloads of a moment (the sweep's: one each stalled the
    event loop that many times)."""
    models: list[weakref.ref[_Cyclic]] = []
    load = _cyclic_loads(models)
    monkeypatch.setattr(COLLECTOR, "delay_s", 60.0)  # the test says when: settle below

    async def scenario() -> None:
        pools = [_pool(_vm(tmp_path / str(i)), cast(Loads, load), ManualClock()) for i in range(3)]
        for pool in pools:
            await pool.run(pool.slots[0], await pool.ensure(pool.slots[0]), [X])
        assert all(ref() is not None for ref in models) and gc.get_freeze_count() > 0
        with _full_collections() as full:
            for pool in pools:
                await pool.drop(pool.slots[0])
            assert COLLECTOR.pending and full == []  # within its delay
            await asyncio.to_thread(COLLECTOR.settle)  # (what the delay's timer runs)
            assert full == [1] and [ref() for ref in models] == [None, None, None]
        for pool in pools:
            await pool.close()

    asyncio.run(scenario())


def test_a_load_runs_the_pending_collection_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What was unloaded (to make room, say) is freed before the next model loads."""
    monkeypatch.setattr(COLLECTOR, "delay_s", 60.0)  # not the timer: the load runs it
    models: list[weakref.ref[_Cyclic]] = []
    at_load: list[bool] = []
    load = _cyclic_loads(
        models, lambda: at_load.append(all(r() is None for r in models) and not COLLECTOR.pending)
    )

    async def scenario() -> None:
        first, second = (_pool(_vm(tmp_path / n), cast(Loads, load), ManualClock()) for n in "ab")
        await first.ensure(first.slots[0])
        await first.drop(first.slots[0])
        assert COLLECTOR.pending and models[0]() is not None
        await second.ensure(second.slots[0])
        assert at_load == [True, True]
        await first.close()
        await second.close()

    asyncio.run(scenario())


def test_a_worker_process_instance_freezes_nothing_here_and_unloads_with_no_full_collection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's model lives in its process: its load freezes nothing of the server's
    (the freeze is for a model loaded here), and its unload runs no collection of the
    whole server (which holds the event loop, longer with every function the node has
    served). Loaded and unloaded again and again, what each left is freed by the
    ordinary collector: nothing stays frozen."""
    loaded: list[weakref.ref[ProcessInstance]] = []
    full: list[int] = []
    unfreeze = gc.unfreeze
    monkeypatch.setattr(gc, "unfreeze", lambda: full.append(1) or unfreeze())

    async def scenario() -> None:
        pool = _worker_pool(tmp_path, loaded)
        frozen = gc.get_freeze_count()
        for _ in range(3):
            instance = await pool.ensure(pool.slots[0])
            x = {"x": np.full((1, 4), 7, np.float32)}
            assert (await pool.run(pool.slots[0], instance, [x])).results[0]["y"][0, 0] == 14
            del instance
            await pool.drop(pool.slots[0])
        assert gc.get_freeze_count() <= frozen and full == []  # (frozen ones may end)
        gc.collect()
        assert [ref() for ref in loaded] == [None, None, None]
        await pool.close()

    asyncio.run(scenario())


def _worker_pool(tmp_path: Path, loaded: list[weakref.ref[ProcessInstance]]) -> InstancePool:
    """A pool of a worker-process function whose instances ``loaded`` follows."""
    repository = Repository(FileStore(tmp_path / "store"))
    fields = {"mode": "process", "timeout_s": 0, "memory_limit_bytes": 0}
    vm = publish(repository, write_function(tmp_path / "src", "w", HANDLER, ISOLATED, **fields))
    loader = InstanceLoader(repository, tmp_path / "cache", detect_device("cpu"))

    def load(vm: VersionManifest, executor: ThreadPoolExecutor) -> Runnable:
        instance = launch(loader, IsolationMode.PROCESS, vm, executor)
        assert isinstance(instance, ProcessInstance)
        loaded.append(weakref.ref(instance))
        return instance

    return InstancePool(vm, load, ManualClock(), Stats(), NoEvents())


def test_a_worker_instance_that_served_a_while_is_freed_at_its_unload(tmp_path: Path) -> None:
    """Aged into the collector's oldest generation (as an instance serving a while is),
    its unload frees it, with the results of its last batches, at once: nothing cycles
    through an ended instance (before, it waited for a full collection, which may be
    tens of thousands of requests away)."""
    loaded: list[weakref.ref[ProcessInstance]] = []

    async def scenario() -> None:
        pool = _worker_pool(tmp_path, loaded)
        instance = await pool.ensure(pool.slots[0])
        for _ in range(2):
            await pool.run(pool.slots[0], instance, [{"x": np.full((1, 4), 7, np.float32)}])
        del instance
        gc.collect(1)
        gc.collect(1)
        gc.disable()  # freed by its reference count alone, or not at all
        try:
            await pool.drop(pool.slots[0])
            # the executor's thread lets go of its work item (the instance, in its
            # arguments) just after the unload is answered: on a loaded machine the loop
            # may look first
            for _ in range(200):
                if loaded[0]() is None:
                    break
                await asyncio.sleep(0.01)
            assert loaded[0]() is None
        finally:
            gc.enable()
        await pool.close()

    asyncio.run(scenario())


def test_a_worker_instance_unload_collects_no_oldest_generation(tmp_path: Path) -> None:
    async def scenario() -> None:
        pool = _worker_pool(tmp_path, [])
        instance = await pool.ensure(pool.slots[0])
        await pool.run(pool.slots[0], instance, [{"x": np.full((1, 4), 7, np.float32)}])
        del instance
        with _full_collections() as full:
            await pool.drop(pool.slots[0])
        assert full == []
        await pool.close()

    asyncio.run(scenario())


def test_a_thread_instance_is_frozen_out_of_the_collector_at_its_load(tmp_path: Path) -> None:
    models: list[weakref.ref[_Cyclic]] = []

    async def scenario() -> None:
        pool = _pool(_vm(tmp_path), cast(Loads, _cyclic_loads(models)), ManualClock())
        before = gc.get_freeze_count()
        await pool.ensure(pool.slots[0])
        assert gc.get_freeze_count() > before
        assert not any(o is models[0]() for o in gc.get_objects())  # the permanent generation
        await pool.close()

    asyncio.run(scenario())


class _Handed:
    """An instance whose batch is a future the test ends (``run_soon``'s), in a thread slot."""

    stager = None
    alive = True
    apart = False
    timings_s: dict[str, float] = {}

    def __init__(self) -> None:
        self.ran: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def run_soon(self, batch: list[Request], trace: Any = None) -> asyncio.Future[Any]:
        return self.ran

    def run_staged_soon(self, staged: Any, trace: Any = None) -> asyncio.Future[Any]:
        return self.ran


class _Waits(NoEvents):
    def __init__(self) -> None:
        self.waited = 0

    def waiting(self) -> None:
        self.waited += 1


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("apart", [True, False])
def test_a_batch_sent_to_a_worker_process_lets_the_loop_report_meanwhile(
    tmp_path: Path, apart: bool, staged: bool
) -> None:
    """A batch handed to a worker process tells the events that the loop waits for it
    (the reports owed are made meanwhile, off every request's path), whether it was
    sent now or ahead (``run_staged``); one run on the instance's thread does not: the
    handler there needs the GIL the loop would take."""

    async def scenario() -> int:
        events = _Waits()
        vm = _vm(tmp_path, timeout_s=5)
        pool = InstancePool(vm, Loads(), ManualClock(), Stats(), events, in_thread=True)
        instance = _Handed()
        instance.apart = apart
        slot, runnable = pool.slots[0], cast(Runnable, instance)
        if staged:
            run = pool.run_staged(slot, runnable, cast(Staged, SimpleNamespace()))
        else:
            run = pool.run(slot, runnable, [X])
        running = asyncio.ensure_future(run)
        await asyncio.sleep(0)
        waited = events.waited
        instance.ran.set_result(SimpleNamespace(results=[X], infer_s=0.0, output_s=0.0))
        await running
        return waited

    assert asyncio.run(scenario()) == (1 if apart else 0)


def test_a_batch_cancelled_as_it_ends_is_cancelled(tmp_path: Path) -> None:
    """The batcher's task cancelled in the same turn as its thread's batch ends (a swap's
    stop, the node's shutdown) is cancelled: on Python 3.11 ``asyncio.wait_for`` returned
    the batch's result instead, and the batch loop ran on."""

    async def scenario() -> None:
        pool = _pool(_vm(tmp_path, timeout_s=5), Loads(), ManualClock())
        instance = _Handed()
        running = asyncio.ensure_future(pool.run(pool.slots[0], cast(Runnable, instance), [X]))
        await asyncio.sleep(0)  # it waits for the batch
        instance.ran.set_result(SimpleNamespace(results=[X]))
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    asyncio.run(scenario())


def test_a_handler_raising_timeout_error_keeps_its_instance(tmp_path: Path) -> None:
    """A thread's handler that raises TimeoutError itself (its own client timed out) fails
    its batch as any error does; it did not run past ``timeout_s``, so its instance is
    not replaced as a hung one (before, it was: 504 and a restart)."""

    def own_timeout(batch: list[Request]) -> Sequence[Any]:
        raise TimeoutError("the handler's own client")

    async def scenario() -> None:
        stats = Stats()
        pool = _pool(_vm(tmp_path, timeout_s=5), Loads(own_timeout), ManualClock(), stats)
        slot = pool.slots[0]
        instance = await pool.ensure(slot)
        with pytest.raises(TimeoutError, match="own client"):
            await pool.run(slot, instance, [X])
        assert slot.instance is instance and instance.alive
        assert dict(stats.restarts) == {}
        await pool.close()

    asyncio.run(scenario())


def test_a_load_asks_for_the_room_its_last_load_measured_even_none(tmp_path: Path) -> None:
    """The first load of a version asks the budgets for its size; the next ones for what
    the last one held, where it held it: a model wholly on the GPU asks the host for
    nothing (a measured 0 is not "unknown")."""
    vm = packed(write_function(tmp_path, "f"))[0]
    asked: list[tuple[int, int]] = []

    async def make_room(key: str, host_bytes: int, device_bytes: int) -> Callable[[], None]:
        asked.append((host_bytes, device_bytes))
        return lambda: None

    def on_gpu(v: VersionManifest, executor: ThreadPoolExecutor) -> Instance:
        timings = {"fetch_s": 0.0, "verify_s": 0.0, "import_s": 0.0, "load_s": 0.0, "total_s": 0.0}
        return Instance(v, _double, executor, None, timings, 0, device_bytes=600)

    async def scenario() -> None:
        clock, stats = ManualClock(), Stats()
        pool = InstancePool(vm, on_gpu, clock, stats, NoEvents(), make_room, in_thread=True)
        await pool.ensure(pool.slots[0])
        await pool.drop(pool.slots[0])
        await pool.ensure(pool.slots[0])
        await pool.close()

    asyncio.run(scenario())
    assert asked == [(vm.size_bytes, vm.size_bytes), (0, 600)]


def test_the_memory_room_held_for_a_load_is_given_back_whatever_its_end(tmp_path: Path) -> None:
    """The room a load makes is held while it loads (other loads count it), then given
    back once its instance is in the slot (counted there instead) or the load failed:
    nothing is left held, or the budget would shrink for good."""
    vm = packed(write_function(tmp_path, "f"))[0]
    pools: list[InstancePool] = []
    # the pool's instances, as the node's scheduler shows them to the budget
    memory = MemoryBudget(10_000, lambda: [_Holding(p) for p in pools])
    seen: list[int] = []

    def sized(v: VersionManifest, executor: ThreadPoolExecutor) -> Instance:
        seen.append(memory.reserved_bytes)  # while loading: held
        timings = {"fetch_s": 0.0, "verify_s": 0.0, "import_s": 0.0, "load_s": 0.0, "total_s": 0.0}
        return Instance(v, _double, executor, None, timings, 700)

    failing = Loads(fail=1)

    async def scenario() -> None:
        pool = InstancePool(
            vm, sized, ManualClock(), Stats(), NoEvents(), room_maker(memory, None), in_thread=True
        )
        pools.append(pool)
        await pool.ensure(pool.slots[0])
        assert seen == [vm.size_bytes] and memory.reserved_bytes == 0
        assert memory.used_bytes() == 700  # the instance's, counted in its slot
        await pool.close()
        make_room = room_maker(memory, None)
        broken = InstancePool(
            vm, failing, ManualClock(), Stats(), NoEvents(), make_room, in_thread=True
        )
        with pytest.raises(LoadError):
            await broken.ensure(broken.slots[0])
        assert memory.reserved_bytes == 0
        await broken.close()

    asyncio.run(scenario())


@dataclass
class _Holding:
    """A pool as a memory budget sees it (what the node's ``Scheduler`` is)."""

    pool: InstancePool
    key: str = "f/v1"
    device_bytes: int = 0
    last_active_s: float = 0.0
    busy: bool = True

    @property
    def resident_bytes(self) -> int:
        return self.pool.instance_bytes

    async def evict(self) -> bool:
        return False


def test_a_worker_that_died_while_idle_holds_no_memory(tmp_path: Path) -> None:
    """A worker killed while idle (by the kernel, short of memory, say) holds none of the
    node's memory: the budget does not evict live instances for room that is free."""
    loaded: list[weakref.ref[ProcessInstance]] = []

    async def scenario() -> None:
        pool = _worker_pool(tmp_path, loaded)
        instance = await pool.ensure(pool.slots[0])
        assert isinstance(instance, ProcessInstance)
        assert pool.instance_bytes == instance.size_bytes > 0
        os.kill(instance.pid, signal.SIGKILL)
        for _ in range(200):
            if not instance.alive:
                break
            await asyncio.sleep(0.05)
        assert pool.instances == 1 and pool.instance_bytes == 0  # its slot finds out later
        await pool.close()

    asyncio.run(scenario())
