"""The batcher alone: admission, batches by the batching policy, deadlines, closing."""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from test_pool import Loads

from fnrt.functions.errors import (
    DeadlineExceeded,
    HandlerFailed,
    LoadError,
    Overloaded,
    Unavailable,
    VersionRetired,
)
from fnrt.functions.handler import Request
from fnrt.functions.manifest import IsolationMode, TensorSpec
from fnrt.functions.version import VersionManifest
from fnrt.loader.device import detect_device
from fnrt.loader.instance import Instance, InstanceLoader
from fnrt.loader.launch import Launch
from fnrt.loader.process import ProcessInstance
from fnrt.loader.repository import Repository
from fnrt.loader.scrub import Watch
from fnrt.loader.staging import Stager
from fnrt.loader.stores import FileStore
from fnrt.loader.streams import Lanes
from fnrt.runtime.batcher import FIRST_LOAD_GUESS_S, Batcher, answers_written
from fnrt.runtime.batching import JOB_YIELD, job_pause_s
from fnrt.runtime.clock import ManualClock
from fnrt.runtime.events import NoEvents
from fnrt.runtime.intake import Admission
from fnrt.runtime.pool import InstancePool
from fnrt.runtime.stats import Stats
from support import ISOLATED_MANIFEST as ISOLATED
from support import instances_up, packed, past_backoffs, publish, write_function

MANIFEST = """
name = "{name}"
handler = "handler:Echo"

[batching]
max_batch_size = 4
max_wait_ms = 0

[scaling]
max_queue = 6
"""


@dataclass
class Parts:
    """A batcher and the real neighbours it was built with (the test reads these, never
    the batcher's private attributes)."""

    batcher: Batcher
    pool: InstancePool
    clock: ManualClock
    stats: Stats


def _parts(
    tmp_path: Path, loads: Loads, admission: Admission | None = None, manifest: str = MANIFEST
) -> Parts:
    vm = packed(write_function(tmp_path, "b", manifest=manifest))[0]
    clock, stats = ManualClock(), Stats()
    pool = InstancePool(vm, loads, clock, stats, NoEvents())
    return Parts(Batcher(vm, pool, clock, stats, NoEvents(), admission), pool, clock, stats)


def _batcher(tmp_path: Path, loads: Loads, admission: Admission | None = None) -> Batcher:
    return _parts(tmp_path, loads, admission).batcher


def _x(i: float) -> Request:
    return {"x": np.full((1, 4), i, np.float32)}


async def _submit(batcher: Batcher, i: float, timeout_s: float | None = None) -> Any:
    return await batcher.submit(batcher.call(_x(i), 1000.0, timeout_s=timeout_s))


def test_queued_requests_leave_in_batches_of_at_most_the_limit(tmp_path: Path) -> None:
    gate = threading.Event()
    sizes: list[int] = []

    def gated(batch: list[Request]) -> Sequence[Any]:
        gate.wait(10)
        sizes.append(len(batch))
        return [{"y": r["x"] + 1} for r in batch]

    batcher_stats: list[Stats] = []

    async def scenario() -> list[Any]:
        parts = _parts(tmp_path, Loads(gated))
        batcher = parts.batcher
        batcher_stats.append(parts.stats)
        first = asyncio.ensure_future(_submit(batcher, 0))
        for _ in range(100):  # the first batch (of one) is running
            await asyncio.sleep(0.01)
            if batcher.queued == 0 and sizes == [] and parts.pool.instances:
                break
        rest = [asyncio.ensure_future(_submit(batcher, i)) for i in range(1, 6)]
        await asyncio.sleep(0.05)
        gate.set()
        out = await asyncio.gather(first, *rest)
        await batcher.close()
        return out

    out = asyncio.run(scenario())
    assert [float(o.outputs["y"][0, 0]) for o in out] == [1, 2, 3, 4, 5, 6]
    assert sizes == [1, 4, 1]
    # every request's wait counted once, in the summary and in Triton's totals
    stats = batcher_stats[0]
    assert stats.queue_wait.summary()["count"] == 6 and stats.totals.queue.count == 6


def test_admission_bounds_the_queue_per_version_and_per_node(tmp_path: Path) -> None:
    async def scenario() -> None:
        loading = threading.Event()  # the first load waits: nothing leaves the queue
        batcher = _batcher(tmp_path, Loads(gate=loading), Admission(max_queued=100))
        queued = []
        for _ in range(6):
            queued.append(batcher.submit(batcher.call(_x(1), 1000.0)))
            await asyncio.sleep(0)
        assert batcher.queued == 6
        with pytest.raises(Overloaded, match="6 requests queued"):
            batcher.submit(batcher.call(_x(1), 1000.0))
        loading.set()
        await asyncio.gather(*queued)
        node = _batcher(tmp_path / "n", Loads(), Admission(max_queued=0))
        with pytest.raises(Overloaded, match="the server has 0 requests queued"):
            node.submit(node.call(_x(1), 1000.0))
        await batcher.close()
        await node.close()

    asyncio.run(scenario())


def test_a_deadline_that_passes_in_the_queue_is_a_504(tmp_path: Path) -> None:
    gate = threading.Event()

    def gated(batch: list[Request]) -> Sequence[Any]:
        gate.wait(10)
        return [{"y": r["x"]} for r in batch]

    async def scenario() -> None:
        parts = _parts(tmp_path, Loads(gated))
        batcher, clock = parts.batcher, parts.clock
        blocker = asyncio.ensure_future(_submit(batcher, 0))
        await asyncio.sleep(0.05)
        late = asyncio.ensure_future(_submit(batcher, 1, timeout_s=0.5))
        await asyncio.sleep(0.01)
        clock.advance(1)
        with pytest.raises(DeadlineExceeded, match="deadline passed"):
            await late
        gate.set()
        await blocker
        assert parts.stats.expired == 1
        await batcher.close()
        with pytest.raises(VersionRetired):
            batcher.submit(batcher.call(_x(1), clock.now()))

    asyncio.run(scenario())


def test_blocks_of_job_records_fill_what_live_requests_leave(tmp_path: Path) -> None:
    gate = threading.Event()
    batches: list[list[float]] = []

    def gated(batch: list[Request]) -> Sequence[Any]:
        gate.wait(10)
        batches.append([float(r["x"][0, 0]) for r in batch])
        return [{"y": r["x"] + 1} for r in batch]

    async def scenario() -> tuple[Any, ...]:
        parts = _parts(tmp_path, Loads(gated))
        batcher = parts.batcher
        first = asyncio.ensure_future(_submit(batcher, 0))
        for _ in range(100):  # the first batch (of one) is running
            await asyncio.sleep(0.01)
            if batcher.queued == 0 and parts.pool.instances:
                break
        block = asyncio.ensure_future(batcher.submit_block([_x(10), _x(11), _x(12)]))
        small = asyncio.ensure_future(batcher.submit_block([_x(20)]))
        live = [asyncio.ensure_future(_submit(batcher, i)) for i in (1, 2)]
        await asyncio.sleep(0.05)
        gate.set()
        out = await asyncio.gather(first, block, small, *live)
        await batcher.close()
        return tuple(out)

    _, block, small, _, two = asyncio.run(scenario())
    # live requests first; a block joins a batch only whole (the three do not fit in
    # the two places left) and blocks keep their order: the next batch takes both
    assert batches == [[0.0], [1.0, 2.0], [10.0, 11.0, 12.0, 20.0]]
    assert [float(o["y"][0, 0]) for o in block] == [11.0, 12.0, 13.0]
    assert [float(o["y"][0, 0]) for o in small] == [21.0]
    assert float(two.outputs["y"][0, 0]) == 3.0


def test_a_failed_block_fails_every_record_in_it(tmp_path: Path) -> None:
    def failing(batch: list[Request]) -> Sequence[Any]:
        raise ValueError("no")

    async def scenario() -> None:
        batcher = _batcher(tmp_path, Loads(failing))
        with pytest.raises(HandlerFailed, match="ValueError: no"):
            await batcher.submit_block([_x(1), _x(2), _x(3)])
        await batcher.close()

    asyncio.run(scenario())


def test_job_batches_pause_only_while_live_requests_arrive() -> None:
    assert job_pause_s(0.002, live_rate_per_s=0.0) == 0.0  # idle: jobs take it all
    assert job_pause_s(0.002, live_rate_per_s=0.5) == 0.0
    assert job_pause_s(0.002, live_rate_per_s=500.0) == pytest.approx(0.002 * JOB_YIELD)
    assert job_pause_s(0.002, live_rate_per_s=500.0, yield_factor=1.0) == pytest.approx(0.002)


def test_an_idle_batcher_holds_no_instance_unloaded_meanwhile(tmp_path: Path) -> None:
    """Waiting for the next request, the batch loop holds neither its last batch nor the
    instance that ran it: one unloaded meanwhile is freed at its unload, not at the
    function's next call."""
    loads = Loads()

    async def scenario() -> None:
        parts = _parts(tmp_path, loads)
        assert (await _submit(parts.batcher, 1.0)).outputs["y"][0, 0] == 2
        instance = parts.pool.slots[0].instance
        assert instance is not None
        gone = weakref.ref(instance)
        del instance
        await asyncio.sleep(0)  # the loop goes idle
        await parts.pool.drop(parts.pool.slots[0])
        # the executor's threads let go of their work items (the batch's, the unload's:
        # the instance is in their arguments) just after answering: on a loaded machine
        # the loop may look first
        for _ in range(200):
            if gone() is None:
                break
            await asyncio.sleep(0.01)
        assert gone() is None
        await parts.batcher.close()

    asyncio.run(scenario())


def _plus_one_after(gate: threading.Event) -> Any:
    """A handler that answers each request with its input plus one once ``gate`` opens."""

    def gated(batch: list[Request]) -> Sequence[Any]:
        gate.wait(10)
        return [{"y": r["x"] + 1} for r in batch]

    return gated


def test_with_nothing_queued_answers_leave_before_the_batch_is_accounted(
    tmp_path: Path,
) -> None:
    """A lone request's answer is not held back by its batch's accounting (statistics,
    cost model, metrics: two turns later); with requests queued the slot goes on to
    them at once and accounts first."""
    gate = threading.Event()
    gated = _plus_one_after(gate)

    async def scenario() -> None:
        parts = _parts(tmp_path, Loads(gated))
        batcher, stats = parts.batcher, parts.stats
        gate.set()
        await _submit(batcher, 0)  # loads the instance
        await answers_written()
        assert stats.batches == 1
        seen: list[int] = []
        lone = asyncio.ensure_future(_submit(batcher, 1))
        lone.add_done_callback(lambda _: seen.append(stats.batches))
        await lone
        assert seen == [1]  # answered with its batch not counted yet
        await answers_written()
        assert stats.batches == 2
        # a batch with requests queued behind it: counted before the next one runs
        gate.clear()
        seen.clear()
        first = asyncio.ensure_future(_submit(batcher, 2))
        for _ in range(1000):
            await asyncio.sleep(0.01)
            if batcher.queued == 0:
                break
        queued = asyncio.ensure_future(_submit(batcher, 3))
        first.add_done_callback(lambda _: seen.append(stats.batches))
        await asyncio.sleep(0.02)
        gate.set()
        await asyncio.gather(first, queued)
        assert seen == [3]
        await batcher.close()

    asyncio.run(scenario())


class StagedLoads(Loads):
    """Instances whose handler has ``forward`` (a stager): batches can be staged ahead."""

    def __call__(self, vm: VersionManifest, executor: ThreadPoolExecutor) -> Instance:
        instance = super().__call__(vm, executor)
        spec = {"x": TensorSpec("float32", (-1, 4))}
        out = {"y": TensorSpec("float32", (-1, 4))}
        instance.stager = Stager(lambda inputs: {"y": inputs["x"] + 1}, spec, out, Lanes())
        return instance


def test_a_batch_with_one_staged_behind_it_is_accounted_at_once(tmp_path: Path) -> None:
    """A lone request's batch whose watch staged a full batch behind it (the queue
    empty, the next batch waiting on the instance) does not hold the slot back for its
    answer's writes: accounted at once, the staged batch runs next."""
    gate = threading.Event()
    gated = _plus_one_after(gate)

    async def scenario() -> None:
        parts = _parts(tmp_path, StagedLoads(gated))
        batcher, stats = parts.batcher, parts.stats
        gate.set()
        await _submit(batcher, 0)
        await answers_written()
        gate.clear()
        lone = asyncio.ensure_future(_submit(batcher, 1))
        for _ in range(1000):
            await asyncio.sleep(0.005)
            if parts.pool.running and batcher.queued == 0:
                break
        full = [asyncio.ensure_future(_submit(batcher, i)) for i in range(2, 6)]
        for _ in range(1000):  # the watch stages them
            await asyncio.sleep(0.005)
            if batcher.queued == 0:
                break
        assert batcher.queued == 0 and not lone.done()
        seen: list[int] = []
        lone.add_done_callback(lambda _: seen.append(stats.batches))
        gate.set()
        served = await asyncio.gather(lone, *full)
        assert seen == [2]  # counted before its answer's callbacks ran
        assert [float(s.outputs["y"][0, 0]) for s in served] == [2, 3, 4, 5, 6]
        await batcher.close()

    asyncio.run(scenario())


class RecordedStaging(StagedLoads):
    """:class:`StagedLoads` whose stager records, at each batch it stages, how many
    batches the version had counted then (``stats``: set once the parts are built)."""

    def __init__(self, handler: Any) -> None:
        super().__init__(handler)
        self.stats: Stats | None = None
        self.staged_at: list[int] = []

    def __call__(self, vm: VersionManifest, executor: ThreadPoolExecutor) -> Instance:
        instance = super().__call__(vm, executor)
        assert instance.stager is not None
        stage = instance.stager.stage

        def recorded(batch: list[Request]) -> Any:
            assert self.stats is not None
            self.staged_at.append(self.stats.batches)
            return stage(batch)

        instance.stager.stage = recorded  # type: ignore[method-assign]
        return instance


def test_a_request_arriving_while_a_lone_batch_is_accounted_is_not_staged_behind_it(
    tmp_path: Path,
) -> None:
    """A request that arrives in the turns a lone batch leaves its answers before its
    accounting (here: its caller's next request, sent as the answer reaches it) is
    queued and run as its own batch, not staged on the instance behind that accounting
    (nor onto an instance dropped meanwhile: the slot is idle then)."""
    gate = threading.Event()
    gate.set()
    loads = RecordedStaging(_plus_one_after(gate))
    one = MANIFEST.replace("max_batch_size = 4", "max_batch_size = 1")

    async def scenario() -> None:
        parts = _parts(tmp_path, loads, manifest=one)
        batcher, stats = parts.batcher, parts.stats
        loads.stats = stats
        await _submit(batcher, 0)  # loads the instance
        await answers_written()
        assert stats.batches == 1
        second: list[asyncio.Future[Any]] = []
        lone = batcher.submit(batcher.call(_x(1), 1000.0))
        # submitted in the turn the answer reaches its caller (a sequential in-process
        # caller; a pipelined or HTTP/2 client's next request likewise)
        lone.add_done_callback(lambda _: second.append(batcher.submit(batcher.call(_x(2), 1000.0))))
        await lone
        for _ in range(1000):
            await asyncio.sleep(0.005)
            if second and second[0].done():
                break
        served = await second[0]
        assert float(served.outputs["y"][0, 0]) == 3
        await answers_written()
        assert stats.batches == 3
        assert loads.staged_at == []  # (staged after 1 batch counted, before the fix)
        await batcher.close()

    asyncio.run(scenario())


class _FailingFromNowOn(Loads):
    """Loads that succeed until ``failing`` is set, then fail (its store went down)."""

    failing = False

    def __call__(self, vm: VersionManifest, executor: ThreadPoolExecutor) -> Instance:
        if self.failing:
            self.count += 1
            raise OSError("weights are corrupt")
        return super().__call__(vm, executor)


TWO = MANIFEST.replace("max_queue = 6", "max_queue = 6\nmin_instances = 2\nmax_instances = 2")


def test_closing_while_the_primary_cannot_load_ends_once_the_others_drain(
    tmp_path: Path,
) -> None:
    """The primary slot lost its instance and its loads fail now, while a second slot
    serves the queue. Closing the version (a re-deploy, a retirement) answers what was
    queued, then ends: the primary does not wait for an arrival that cannot come."""
    hold = threading.Event()
    hold.set()
    loads = _FailingFromNowOn(_plus_one_after(hold))

    async def scenario() -> None:
        parts = _parts(tmp_path, loads, manifest=TWO)
        batcher, pool, clock = parts.batcher, parts.pool, parts.clock
        assert (await _submit(batcher, 1.0)).outputs["y"][0, 0] == 2
        await instances_up(pool, 2)
        await pool.drop(pool.slots[0])  # the primary's instance is gone
        loads.failing = True
        hold.clear()  # the second slot's batches wait
        queued = [asyncio.ensure_future(_submit(batcher, float(i))) for i in range(6)]
        await asyncio.sleep(0.05)
        closed = asyncio.ensure_future(batcher.close())
        hold.set()
        # the primary's load backs off, then fails again
        assert await past_backoffs(closed, clock), "the version never finished closing"
        answers = await asyncio.gather(*queued)
        assert [a.outputs["y"][0, 0] for a in answers] == [float(i) + 1 for i in range(6)]
        assert loads.count >= 3  # two loads, then the primary's failed ones

    asyncio.run(scenario())


def test_what_is_still_queued_when_every_slot_has_ended_is_answered_503(tmp_path: Path) -> None:
    """Closing while the primary cannot load and the other slot goes too (unloaded once
    its batch is done): nothing is left to run the queue, and close answers it 503
    rather than leave its callers waiting for good."""
    hold = threading.Event()
    hold.set()
    loads = _FailingFromNowOn(_plus_one_after(hold))

    async def scenario() -> None:
        parts = _parts(tmp_path, loads, manifest=TWO)
        batcher, pool, clock = parts.batcher, parts.pool, parts.clock
        assert (await _submit(batcher, 1.0)).outputs["y"][0, 0] == 2
        await instances_up(pool, 2)
        await pool.drop(pool.slots[0])
        loads.failing = True
        hold.clear()
        queued = [asyncio.ensure_future(_submit(batcher, float(i))) for i in range(6)]
        await asyncio.sleep(0.05)  # the second slot runs a batch of four; two wait
        closed = asyncio.ensure_future(batcher.close())
        await asyncio.sleep(0.01)
        unloading = asyncio.ensure_future(pool.drop(pool.slots[1]))  # its loop ends next
        hold.set()
        finished = await past_backoffs(closed, clock)
        await unloading
        assert finished, "the version never finished closing"
        done, _ = await asyncio.wait(queued, timeout=1)
        assert len(done) == 6, "queued calls were left unanswered"
        answered = [q.result().outputs["y"][0, 0] for q in queued[:4]]
        assert answered == [1.0, 2.0, 3.0, 4.0]
        for q in queued[4:]:
            with pytest.raises(Unavailable, match="closed before it ran"):
                q.result()

    asyncio.run(scenario())


#: A worker's handler whose ``load`` says it began (a file) and waits for a gate file,
#: then loads, or raises when the gate says so; ``__call__`` echoes ``x + 1``.
GATED_LOAD = """
import os, time

class H:
    def load(self, artifacts, device):
        open({began!r}, "w").close()
        deadline = time.monotonic() + 20
        while not os.path.exists({gate!r}) and time.monotonic() < deadline:
            time.sleep(0.005)
        if open({gate!r}).read() == "fail":
            raise ValueError("weights are corrupt")

    def __call__(self, batch):
        return [{{"y": r["x"] + 1}} for r in batch]
"""


def _worker_parts(
    tmp_path: Path, watch_files: Callable[[VersionManifest], Watch | None] | None = None
) -> tuple[Parts, Path, Path]:
    """A batcher over a pool that loads real worker processes (the node's own load),
    and the files the handler's load signals on: (parts, began, gate)."""
    began, gate = tmp_path / "began", tmp_path / "gate"
    handler = GATED_LOAD.format(began=str(began), gate=str(gate))
    fields = {"mode": "process", "timeout_s": 0, "memory_limit_bytes": 0}
    repository = Repository(FileStore(tmp_path / "store"))
    vm = publish(repository, write_function(tmp_path / "src", "w", handler, ISOLATED, **fields))
    loader = InstanceLoader(repository, tmp_path / "cache", detect_device("cpu"))
    clock, stats = ManualClock(), Stats()
    launch = Launch(loader, IsolationMode.PROCESS)
    pool = InstancePool(vm, launch, clock, stats, NoEvents(), watch_files=watch_files)
    return Parts(Batcher(vm, pool, clock, stats, NoEvents()), pool, clock, stats), began, gate


def _open(gate: Path, word: str) -> None:
    """Let the gated load go on (``go``) or fail (``fail``): the file appears whole (a
    rename), so the handler, which reads it as soon as it exists, never reads it empty
    (written in place, a ``fail`` read before its bytes were in was a load that passed)."""
    written = gate.with_name(gate.name + ".tmp")
    written.write_text(word)
    written.replace(gate)


async def _until_exists(path: Path) -> None:
    for _ in range(2000):
        if path.exists():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{path} never came")


def test_a_cold_starts_first_batch_is_sent_while_its_worker_loads(tmp_path: Path) -> None:
    """The first batch follows the load message at once (its worker runs it as soon as
    its load returns, with no round trip between): the requests queued then; those
    arriving during the load come in the batches after, and all are answered."""

    async def scenario() -> tuple[list[float], int]:
        parts, began, gate = _worker_parts(tmp_path)
        batcher = parts.batcher
        first = asyncio.ensure_future(_submit(batcher, 1))
        await _until_exists(began)  # the worker is in the handler's load
        later = [asyncio.ensure_future(_submit(batcher, i)) for i in (2, 3, 4)]
        await asyncio.sleep(0.05)
        _open(gate, "go")
        out = await asyncio.gather(first, *later)
        instance = parts.pool.slots[0].instance
        assert isinstance(instance, ProcessInstance)
        sent = instance.sent_during_load
        await batcher.close()
        await parts.pool.close()
        return [float(o.outputs["y"][0, 0]) for o in out], sent

    answers, sent_during_load = asyncio.run(scenario())
    assert answers == [2, 3, 4, 5]
    assert sent_during_load == 1


def test_a_batch_sent_to_a_worker_whose_load_then_fails_gets_the_loads_error(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        parts, began, gate = _worker_parts(tmp_path)
        batcher = parts.batcher
        first = asyncio.ensure_future(_submit(batcher, 1))
        await _until_exists(began)
        _open(gate, "fail")
        with pytest.raises(LoadError, match="weights are corrupt"):
            await asyncio.wait_for(first, 20)
        assert batcher.queued == 0
        await batcher.close()
        await parts.pool.close()

    asyncio.run(scenario())


def test_a_request_whose_deadline_may_pass_during_the_load_is_not_sent_with_it(
    tmp_path: Path,
) -> None:
    """Its deadline is sooner than the load is expected to take (a first load: a guess):
    it waits in the queue, where its deadline is watched, not in a worker's socket."""

    async def scenario() -> int:
        parts, began, gate = _worker_parts(tmp_path)
        batcher = parts.batcher
        assert FIRST_LOAD_GUESS_S > 1
        first = asyncio.ensure_future(_submit(batcher, 1, timeout_s=1.0))
        await _until_exists(began)
        await asyncio.sleep(0.05)
        _open(gate, "go")
        out = await first
        assert float(out.outputs["y"][0, 0]) == 2
        instance = parts.pool.slots[0].instance
        assert isinstance(instance, ProcessInstance)
        await batcher.close()
        await parts.pool.close()
        return instance.sent_during_load

    assert asyncio.run(scenario()) == 0


def test_a_worker_whose_first_batch_is_in_flight_when_its_load_fails_to_be_served_ends_now(
    tmp_path: Path,
) -> None:
    """The load returns, but the watch on its files cannot start: the instance is closed
    while the batch sent with its load is still running in it. It is ended at once (no
    graceful close racing the loop for the worker's socket, and no 10 s wait for a
    close reply that the batch's reply would stand in front of); the batch gets the 503."""

    def watch_files(vm: VersionManifest) -> Watch | None:
        raise FileNotFoundError("the blob went before its record was read")

    async def scenario() -> ProcessInstance:
        parts, began, gate = _worker_parts(tmp_path, watch_files)
        batcher = parts.batcher
        first = asyncio.ensure_future(_submit(batcher, 1))
        await _until_exists(began)
        _open(gate, "go")
        with pytest.raises(Unavailable, match="could not start"):
            await asyncio.wait_for(first, 5)
        await batcher.close()
        await parts.pool.close()
        return cast(ProcessInstance, loaded[0])

    loaded: list[Any] = []
    original = ProcessInstance.send_early

    def recorded(self: ProcessInstance, batch: list[Request], traced: bool = True) -> Any:
        loaded.append(self)
        return original(self, batch, traced)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ProcessInstance, "send_early", recorded)
        started = time.monotonic()
        instance = asyncio.run(scenario())
    assert time.monotonic() - started < 5
    assert instance.sent_during_load == 1 and not instance.alive
