"""One version's loads alone: no server, a manual clock, the node's real two-step load
(``Launch``) of a thread instance from a folder store, and small fakes of the memory
budgets' ``make_room``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path

import fnrt_test_gates  # type: ignore[import-not-found]
import pytest

from fnrt.functions.errors import BlobNotFound, LoadError, Unavailable
from fnrt.functions.manifest import IsolationMode
from fnrt.functions.version import VersionManifest
from fnrt.loader.device import detect_device
from fnrt.loader.instance import STAGES, InstanceLoader, Prepared, Runnable
from fnrt.loader.launch import Launch, OnSent
from fnrt.loader.repository import Repository
from fnrt.loader.scrub import Watch
from fnrt.loader.stores import FileStore
from fnrt.runtime.clock import ManualClock
from fnrt.runtime.events import NoEvents
from fnrt.runtime.loads import Loads
from fnrt.runtime.stats import Stats
from support import WEIGHTED_HANDLER, WEIGHTED_MANIFEST, assert_stages_add_up, publish
from support import write_function as write

#: WEIGHTED_HANDLER with an ``unload`` that says it ran (``fnrt_test_gates.unloads``).
UNLOADED_HANDLER = (
    WEIGHTED_HANDLER
    + """
    def unload(self):
        fnrt_test_gates.unloads.append(1)
"""
)


@dataclass
class Slot:
    index: int = 0
    failures: int = 0
    retry_at: float = 0.0
    backing_off: bool = False


@dataclass(frozen=True)
class Recorded(Launch):
    """The node's load, its steps recorded in order; its ``prepare`` waits for ``gate``
    when one is given."""

    steps: list[str] = field(default_factory=list)
    gate: threading.Event | None = None
    made: list[Runnable] = field(default_factory=list)  # the instances its loads made

    def prepare(self, vm: VersionManifest) -> Prepared:
        self.steps.append("prepare")
        if self.gate is not None:
            self.gate.wait(10)
        return super().prepare(vm)

    def load(
        self,
        vm: VersionManifest,
        executor: Executor,
        prepared: Prepared,
        on_sent: OnSent | None = None,
    ) -> Runnable:
        self.steps.append("load")
        instance = super().load(vm, executor, prepared, on_sent)
        self.made.append(instance)
        return instance

    def give_back(self, prepared: Prepared) -> None:
        self.steps.append("give back")
        super().give_back(prepared)


def _parts(
    tmp_path: Path, gate: threading.Event | None = None, handler: str = WEIGHTED_HANDLER
) -> tuple[Repository, VersionManifest, Recorded]:
    repository = Repository(FileStore(tmp_path / "store"))
    folder = write(tmp_path / "src", "w", handler, WEIGHTED_MANIFEST, files={"w.bin": b"7"})
    vm = publish(repository, folder)
    loader = InstanceLoader(repository, tmp_path / "cache", detect_device("cpu"))
    return repository, vm, Recorded(loader, IsolationMode.THREAD, gate=gate)


def _loads(
    vm: VersionManifest,
    launch: Recorded,
    make_room: Callable[[str, int, int], object],
    stats: Stats | None = None,
) -> Loads:
    async def room(key: str, host_bytes: int, device_bytes: int) -> Callable[[], None]:
        launch.steps.append("room")
        made = make_room(key, host_bytes, device_bytes)
        if asyncio.iscoroutine(made):
            await made

        def release() -> None:
            launch.steps.append("release")

        return release

    return Loads(vm, launch, ManualClock(), stats or Stats(), NoEvents(), room)


def test_a_load_readies_its_files_before_it_makes_room_and_counts_the_wait(
    tmp_path: Path,
) -> None:
    _, vm, launch = _parts(tmp_path)
    loads = _loads(vm, launch, lambda *_: asyncio.sleep(0.05))  # evictions take a while

    instance, _, _, release = asyncio.run(loads.load(Slot()))
    try:
        release()
        assert launch.steps == ["prepare", "room", "load", "release"]
        timings = instance.timings_s
        assert timings["room_s"] >= 0.05  # the wait for room is a stage of its cold start
        assert set(timings) - {"fetch_s", "verify_s", "total_s"} <= set(STAGES)
        assert_stages_add_up(timings)
    finally:
        instance.close()


def test_a_store_that_fails_makes_no_room(tmp_path: Path) -> None:
    """The files come first: a blob gone from the store raises before the budgets are
    asked for room (which would evict warm instances for a load that cannot happen)."""
    repository, vm, launch = _parts(tmp_path)
    digest = vm.artifacts["w"].digest
    path = repository.blob_path(digest)
    assert path is not None
    path.unlink()
    loads = _loads(vm, launch, lambda *_: None)

    with pytest.raises(BlobNotFound):
        asyncio.run(loads.load(Slot()))
    assert launch.steps == ["prepare"]


@pytest.mark.parametrize("fault", ["raises", "cancelled"])
def test_a_load_that_gets_no_room_gives_its_files_back(tmp_path: Path, fault: str) -> None:
    _, vm, launch = _parts(tmp_path)

    def make_room(*_: object) -> object:
        if fault == "raises":
            raise MemoryError("no room")
        return asyncio.sleep(60)

    stats = Stats()
    loads = _loads(vm, launch, make_room, stats)

    async def attempt() -> None:
        task = asyncio.ensure_future(loads.load(Slot()))
        while "room" not in launch.steps:
            await asyncio.sleep(0.01)
        if fault == "cancelled":
            task.cancel()
        await task

    with pytest.raises(LoadError if fault == "raises" else asyncio.CancelledError):
        asyncio.run(attempt())
    assert launch.steps == ["prepare", "room", "give back"]
    # a load stopped is not one that failed: the slot's next load does not back off
    assert stats.load_failures == (1 if fault == "raises" else 0)


def test_a_load_cancelled_while_it_prepares_gives_its_files_back_once_ready(
    tmp_path: Path,
) -> None:
    gate = threading.Event()
    _, vm, launch = _parts(tmp_path, gate)
    loads = _loads(vm, launch, lambda *_: None)

    async def attempt() -> None:
        task = asyncio.ensure_future(loads.load(Slot()))
        while "prepare" not in launch.steps:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()  # the thread readies what it was readying: given back, not kept
        for _ in range(500):
            if "give back" in launch.steps:
                break
            await asyncio.sleep(0.01)

    asyncio.run(attempt())
    assert launch.steps == ["prepare", "give back"]


CANCELLING_HANDLER = """
import concurrent.futures

class Weighted:
    def load(self, artifacts, device):
        future = concurrent.futures.Future()
        future.cancel()
        future.result()  # a shard's future cancelled: the handler's own failure

    def __call__(self, batch):
        return []
"""


def test_a_handler_whose_load_raises_a_cancel_failed_and_was_not_cancelled(
    tmp_path: Path,
) -> None:
    """What the handler raises (a future's CancelledError) is its own failure, with a
    backoff: only a load whose task is cancelled is re-raised as one."""
    _, vm, launch = _parts(tmp_path, handler=CANCELLING_HANDLER)
    stats = Stats()
    loads = _loads(vm, launch, lambda *_: None, stats)
    slot = Slot()

    with pytest.raises(LoadError, match="CancelledError"):
        asyncio.run(loads.load(slot))
    assert stats.load_failures == 1 and slot.failures == 1


def test_a_load_opens_its_watch_on_its_own_thread_right_after_the_instance(
    tmp_path: Path,
) -> None:
    """The watch on the files is opened by the load's thread (no hop back to the loop in
    between), and handed back with the instance."""
    _, vm, launch = _parts(tmp_path)
    loads = _loads(vm, launch, lambda *_: None)
    opened: list[tuple[str, str]] = []
    watch = Watch([])

    def open_watch() -> Watch:
        opened.append((threading.current_thread().name, launch.steps[-1]))
        return watch

    instance, got, _, release = asyncio.run(loads.load(Slot(), open_watch))
    try:
        release()
        assert got is watch
        assert opened == [(f"fnrt-{vm.name}-0_0", "load")]  # the instance's own thread
    finally:
        instance.close()


def test_a_watch_that_fails_to_open_fails_the_load_and_closes_its_instance(
    tmp_path: Path,
) -> None:
    """The node's files could not be watched (a blob gone before its record was read):
    503, the instance closed (its unload run), and no backoff: the handler did nothing
    wrong, and its breaker must not count it."""
    _, vm, launch = _parts(tmp_path, handler=UNLOADED_HANDLER)
    stats = Stats()
    loads = _loads(vm, launch, lambda *_: None, stats)
    slot = Slot()
    fnrt_test_gates.unloads = []

    def open_watch() -> Watch:
        raise FileNotFoundError("the blob went before its record was read")

    with pytest.raises(Unavailable, match="the watch on its files could not start"):
        asyncio.run(loads.load(slot, open_watch))
    assert launch.steps == ["prepare", "room", "load", "release"]
    assert [i.alive for i in launch.made] == [False]
    assert fnrt_test_gates.unloads == [1]
    assert stats.load_failures == 1 and slot.failures == 0  # no backoff


def test_a_load_cancelled_while_its_thread_runs_closes_what_the_thread_made(
    tmp_path: Path,
) -> None:
    """Cancelled while its thread loads and opens the watch (a node that stops), the
    thread goes on: the instance it made (a worker would run on) and the watch it
    registered with the scrub (which would re-read files nothing serves) are closed
    once it is done, not left behind."""
    _, vm, launch = _parts(tmp_path, handler=UNLOADED_HANDLER)
    loads = _loads(vm, launch, lambda *_: None)
    fnrt_test_gates.unloads = []
    entered, gate = threading.Event(), threading.Event()
    closed: list[Watch] = []
    watch = Watch([], closed.append)  # what the scrub would stop watching

    def open_watch() -> Watch:
        entered.set()
        gate.wait(10)
        return watch

    async def attempt() -> None:
        task = asyncio.ensure_future(loads.load(Slot(), open_watch))
        await asyncio.to_thread(entered.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()
        for _ in range(500):
            if closed and fnrt_test_gates.unloads:
                return
            await asyncio.sleep(0.01)

    asyncio.run(attempt())
    assert closed == [watch]
    assert [i.alive for i in launch.made] == [False]
    assert fnrt_test_gates.unloads == [1]  # its handler's unload ran (on its own thread)


def test_a_load_cut_off_by_the_end_of_its_event_loop_still_closes_what_it_made(
    tmp_path: Path,
) -> None:
    """The node stops (``asyncio.run`` ends, cancelling the load) while the load's thread
    is still at work: with no event loop left, what that thread makes is closed all the
    same (a worker process would run on, the scrub would keep re-reading its files)."""
    _, vm, launch = _parts(tmp_path, handler=UNLOADED_HANDLER)
    loads = _loads(vm, launch, lambda *_: None)
    fnrt_test_gates.unloads = []
    entered, gate = threading.Event(), threading.Event()
    closed: list[Watch] = []
    watch = Watch([], closed.append)

    def open_watch() -> Watch:
        entered.set()
        gate.wait(10)
        return watch

    loading: list[asyncio.Future[object]] = []

    async def main() -> None:
        loading.append(asyncio.ensure_future(loads.load(Slot(), open_watch)))
        await asyncio.to_thread(entered.wait, 10)  # then the loop ends, the load unfinished

    asyncio.run(main())
    assert loading[0].cancelled()
    gate.set()
    deadline = time.monotonic() + 10
    while not (closed and fnrt_test_gates.unloads) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert closed == [watch]
    assert fnrt_test_gates.unloads == [1]
    assert [i.alive for i in launch.made] == [False]
