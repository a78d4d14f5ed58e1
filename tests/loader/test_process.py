"""Worker processes: loading, batches through shared memory, and every way a worker ends."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from fnrt.functions.errors import HandlerTimeout, InstanceLost
from fnrt.functions.handler import Request
from fnrt.functions.manifest import IsolationMode
from fnrt.loader.arena import shm_dir
from fnrt.loader.device import detect_device
from fnrt.loader.instance import InstanceLoader, Ran
from fnrt.loader.launch import launch
from fnrt.loader.process import ProcessInstance, RemoteError, rss_bytes
from fnrt.loader.repository import Repository
from fnrt.loader.spares import start_worker
from fnrt.loader.stores import FileStore
from fnrt.loader.worker import private_bytes
from support import FORWARD_WORKER_MANIFEST, made_folders, publish, write_function
from support import ISOLATED_MANIFEST as MANIFEST
from support import MISBEHAVING_HANDLER as HANDLER


def _loader(tmp_path: Path, **fields: object) -> tuple[InstanceLoader, object]:
    repository = Repository(FileStore(tmp_path / "store"))
    values = {"mode": "process", "timeout_s": 0, "memory_limit_bytes": 0, **fields}
    folder = write_function(tmp_path / "src", "w", HANDLER, MANIFEST, **values)
    vm = publish(repository, folder)
    return InstanceLoader(repository, tmp_path / "cache", detect_device("cpu")), vm


def _start(tmp_path: Path, **fields: object) -> ProcessInstance:
    loader, vm = _loader(tmp_path, **fields)
    instance = launch(loader, IsolationMode.PROCESS, vm, ThreadPoolExecutor(1))  # type: ignore[arg-type]
    assert isinstance(instance, ProcessInstance)
    return instance


def _x(value: float, rows: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full((rows, 4), value, dtype=np.float32)}


def _on_loop(instance: ProcessInstance, batch: list[Request]) -> Ran:
    async def run() -> Ran:
        return await instance.run_soon(batch)

    return asyncio.run(run())


Run = Callable[[ProcessInstance, list[Request]], Ran]
#: The two ways a batch reaches a worker: from the instance's thread (blocking), and
#: from the event loop (the server's way: the reply is awaited on the loop)
WAYS = pytest.mark.parametrize(
    "run", [ProcessInstance.run_timed, _on_loop], ids=["from-thread", "from-loop"]
)


@WAYS
def test_batches_cross_to_the_worker_and_back(tmp_path: Path, run: Run) -> None:
    instance = _start(tmp_path)
    try:
        assert instance.pid != os.getpid()
        ran = run(instance, [_x(7, 2), _x(8, 3)])
        np.testing.assert_array_equal(ran.results[0]["y"], np.full((2, 4), 14, np.float32))
        np.testing.assert_array_equal(ran.results[1]["y"], np.full((3, 4), 16, np.float32))
        pid = run(instance, [_x(6)]).results[0]["y"][0, 0]
        assert int(pid) == instance.pid
        big = run(instance, [_x(9, 1 << 18)])  # 4 MiB each way: the arenas grow
        assert big.results[0]["y"].shape == (1 << 18, 4)
        assert float(big.results[0]["y"].sum()) == 18 * 4 * (1 << 18)
        assert instance.timings_s["total_s"] > 0
    finally:
        instance.close()
    assert not instance.alive
    assert not instance.workdir.exists()  # the arenas are gone with the worker


def test_a_worker_freezes_what_its_imports_and_load_made_out_of_the_collector(
    tmp_path: Path,
) -> None:
    instance = _start(tmp_path)  # a full collection would walk it all during a batch
    try:
        frozen = instance.run_timed([_x(-7)]).results[0]["y"][0, 0]
        assert frozen > 10_000  # numpy, fnrt and the handler at least
    finally:
        instance.close()


def test_a_workers_interpreter_counts_in_its_instances_memory(tmp_path: Path) -> None:
    """What a node's memory budget weighs for a worker's instance includes the worker
    itself: its interpreter and imports hold far more than a small model's tensors."""
    instance = _start(tmp_path)
    try:
        private = private_bytes(instance.pid)  # the worker's heap now, measured from here
        # numpy and fnrt at least; measured before the load, to the MiB (rounded up)
        assert 10 << 20 < instance.interpreter_bytes <= private + (1 << 20)
        assert instance.interpreter_bytes % (1 << 20) == 0
        assert instance.size_bytes >= instance.interpreter_bytes
    finally:
        instance.close()


@WAYS
def test_a_handler_exception_fails_the_batch_and_the_worker_lives(tmp_path: Path, run: Run) -> None:
    instance = _start(tmp_path)
    try:
        with pytest.raises(RemoteError, match="ValueError: bad input"):
            run(instance, [_x(5)])
        assert instance.alive
        assert run(instance, [_x(10)]).results[0]["y"][0, 0] == 20.0
    finally:
        instance.close()


@pytest.mark.parametrize(
    ("what", "cause", "words"),
    [(1, "signal", "SIGSEGV"), (2, "exit", "exited with code 1")],
)
@WAYS
def test_a_worker_that_dies_names_the_cause(
    tmp_path: Path, what: int, cause: str, words: str, run: Run
) -> None:
    instance = _start(tmp_path)
    try:
        with pytest.raises(InstanceLost, match=words) as raised:
            run(instance, [_x(what)])
        assert raised.value.cause == cause
        assert not instance.alive
        with pytest.raises(InstanceLost):  # a dead instance fails at once
            run(instance, [_x(0)])
    finally:
        instance.close()


def test_a_worker_killed_while_another_thread_polls_it_is_not_alive(tmp_path: Path) -> None:
    """``Popen.poll`` says "running" while another thread holds its lock (the memory
    watcher, polling): ``alive`` must not trust it, or a worker killed while idle
    would be given the next batch."""
    instance = _start(tmp_path)
    try:
        assert instance.alive
        process = instance._process
        with process._waitpid_lock:  # type: ignore[attr-defined]  # another thread's poll
            os.kill(instance.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while os.waitid(os.P_PID, instance.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert process.poll() is None  # what Popen says meanwhile
            assert not instance.alive
        assert instance.ended().cause == "signal"
    finally:
        instance.close()


@WAYS
def test_a_batch_past_its_timeout_kills_the_worker(tmp_path: Path, run: Run) -> None:
    instance = _start(tmp_path, timeout_s=0.5)
    try:
        with pytest.raises(HandlerTimeout, match=r"timeout of 0\.5 s"):
            run(instance, [_x(3)])
        assert not instance.alive
        assert rss_bytes(instance.pid) == 0
    finally:
        instance.close()


@WAYS
def test_a_worker_past_its_memory_limit_is_killed(tmp_path: Path, run: Run) -> None:
    instance = _start(tmp_path, memory_limit_bytes=256 << 20)
    try:
        with pytest.raises(InstanceLost, match="memory_limit_bytes") as raised:
            run(instance, [_x(4)])
        assert raised.value.cause == "memory"
    finally:
        instance.close()


@pytest.mark.parametrize("ran_s", [0.0, 0.2], ids=["before-it-ran", "while-it-ran"])
def test_a_batch_from_the_loop_needs_no_thread_and_a_cancelled_one_gives_the_worker_up(
    tmp_path: Path, ran_s: float
) -> None:
    instance = _start(tmp_path)

    async def scenario() -> None:
        ran = await instance.run_soon([_x(7)])  # the executor is shut: no thread ran it
        assert ran.results[0]["y"][0, 0] == 14.0
        cancelled = instance.run_soon([_x(3 if ran_s else 7)])  # sent at once
        if ran_s:
            await asyncio.sleep(ran_s)  # the worker hangs in it
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        # its reply would answer the next batch: the instance is given up instead
        assert not instance.alive
        with pytest.raises(InstanceLost, match="cancelled"):
            await instance.run_soon([_x(7)])

    instance.executor.shutdown()
    try:
        asyncio.run(scenario())
    finally:
        instance.abandon()
    assert rss_bytes(instance.pid) == 0


WEIGHTS_MANIFEST = """
name = "{name}"
handler = "handler:Weights"

[artifacts]
weights = "weights.safetensors"

[isolation]
mode = "process"
"""

WEIGHTS_HANDLER = """
import numpy as np

class Weights:
    def load(self, artifacts, device):
        self.w = artifacts["weights"].arrays()["w"]
        self.total = float(self.w.sum(dtype=np.float64))  # touches every page

    def __call__(self, batch):
        return [{"y": np.full((1,), self.total, np.float32)} for _ in batch]
"""


def pss_bytes(pid: int) -> int:
    """Proportional set size: shared pages count split between their mappers."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no Pss line")


def test_two_workers_of_one_model_share_its_weight_pages(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    size = 256 << 20
    folder = tmp_path / "src" / "big"
    folder.mkdir(parents=True)
    save_file({"w": np.ones(size // 4, np.float32)}, str(folder / "weights.safetensors"))
    repository = Repository(FileStore(tmp_path / "store"))
    vm = publish(
        repository, write_function(tmp_path / "src", "big", WEIGHTS_HANDLER, WEIGHTS_MANIFEST)
    )
    loader = InstanceLoader(repository, tmp_path / "cache", detect_device("cpu"))
    workers = [launch(loader, IsolationMode.PROCESS, vm, ThreadPoolExecutor(1)) for _ in range(2)]
    try:
        assert all(isinstance(w, ProcessInstance) for w in workers)
        for w in workers:
            assert w.run_timed([{}]).results[0]["y"][0] == size // 4
        pss = sum(pss_bytes(w.pid) for w in workers)  # type: ignore[attr-defined]
        # Unshared, two copies would be 512 MiB before either interpreter's own pages.
        assert pss < 1.5 * size, f"two workers hold {pss >> 20} MiB (PSS) of a 256 MiB model"
    finally:
        for w in workers:
            w.close()


# --- two arenas each way: a batch sent while the one before computes -------------------------


def test_two_batches_in_flight_each_get_their_own_answer_and_a_third_waits(
    tmp_path: Path,
) -> None:
    """The second batch is written into the other request arena and sent while the first
    computes; a third waits for the first's pair of arenas; replies come back in order,
    each read from its own response arena."""
    instance = _start(tmp_path)

    async def three() -> list[Ran]:
        first = instance.run_soon([_x(10, 3)])
        second = instance.run_soon([_x(11, 2), _x(12)])
        third = instance.run_soon([_x(13, 1 << 17)])  # grows its arenas while the others fly
        return list(await asyncio.gather(first, second, third))

    try:
        first, second, third = asyncio.run(three())
        np.testing.assert_array_equal(first.results[0]["y"], np.full((3, 4), 20, np.float32))
        np.testing.assert_array_equal(second.results[0]["y"], np.full((2, 4), 22, np.float32))
        np.testing.assert_array_equal(second.results[1]["y"], np.full((1, 4), 24, np.float32))
        assert float(third.results[0]["y"].sum()) == 26 * 4 * (1 << 17)
        assert instance.run_timed([_x(14)]).results[0]["y"][0, 0] == 28.0  # still in step
    finally:
        instance.close()


def test_a_lone_batch_is_read_by_the_loops_reader_callback_with_no_task(
    tmp_path: Path,
) -> None:
    """Nothing in flight (a lone request's batch): its reply is read as it comes by the
    loop's reader callback, with no task (nor a turn of the loop for one) between the
    worker and the batcher; a batch sent while it flies still gets its own reply."""
    instance = _start(tmp_path)

    async def scenario() -> tuple[Ran, Ran, Ran]:
        lone = instance.run_soon([_x(20)])
        assert not isinstance(lone, asyncio.Task)
        assert asyncio.all_tasks() == {asyncio.current_task()}
        first = await lone
        again = instance.run_soon([_x(21)])
        after = instance.run_soon([_x(22)])  # sent while ``again`` flies
        return first, await again, await after

    try:
        first, again, after = asyncio.run(scenario())
        assert first.results[0]["y"][0, 0] == 40.0
        assert again.results[0]["y"][0, 0] == 42.0
        assert after.results[0]["y"][0, 0] == 44.0
    finally:
        instance.close()


def test_a_failed_batch_does_not_take_the_one_sent_after_it(tmp_path: Path) -> None:
    instance = _start(tmp_path)

    async def both() -> tuple[BaseException | Ran, BaseException | Ran]:
        failing = instance.run_soon([_x(5)])  # the handler raises ValueError
        after = instance.run_soon([_x(15)])
        done = await asyncio.gather(failing, after, return_exceptions=True)
        return done[0], done[1]

    try:
        failed, ran = asyncio.run(both())
        assert isinstance(failed, RemoteError)
        assert isinstance(ran, Ran)
        assert ran.results[0]["y"][0, 0] == 30.0
    finally:
        instance.close()


def test_a_batch_sent_ahead_and_released_leaves_the_channel_in_order(tmp_path: Path) -> None:
    """The batcher gives back a batch it sent ahead when it will not run it (the batch
    before failed, say): its reply is read and dropped, so the next batch gets its own."""
    instance = _start(tmp_path)

    async def run() -> Ran:
        running = instance.run_soon([_x(16)])
        staged = await instance.stage_soon([_x(17)])
        assert staged.stager is instance.stager
        staged.release()
        await running
        return await instance.run_soon([_x(18)])

    try:
        assert asyncio.run(run()).results[0]["y"][0, 0] == 36.0
        assert instance.sent_ahead == 1
    finally:
        instance.close()


def test_a_worker_that_dies_fails_the_batch_sent_after_it_too(tmp_path: Path) -> None:
    instance = _start(tmp_path)

    async def both() -> list[BaseException | Ran]:
        dying = instance.run_soon([_x(2)])  # os._exit(1)
        after = instance.run_soon([_x(19)])
        return list(await asyncio.gather(dying, after, return_exceptions=True))

    try:
        dying, after = asyncio.run(both())
        assert isinstance(dying, InstanceLost) and dying.cause == "exit"
        assert isinstance(after, InstanceLost)
        assert not instance.alive
    finally:
        instance.close()


FORWARD_HANDLER = """
import time


class Staged:
    def load(self, artifacts, device):
        pass

    def forward(self, inputs):
        time.sleep(0.002)  # long enough for the next batch to arrive while this computes
        x = inputs["x"]
        return {"y": x * 2 + 1}
"""


def test_400_concurrent_requests_to_a_forward_handler_in_a_worker_each_get_their_own_answer(
    tmp_path: Path,
) -> None:
    """The default mode's overlap, end to end: a ``forward`` handler in a worker process,
    400 requests at once through a live server. While the worker computes batch k, the
    batcher sends batch k+1 into the worker's second request arena and the worker stages
    it on its host lane; every request gets the answer to its own input."""
    import httpx

    from support import live_server

    folder = write_function(
        tmp_path / "src", "staged", FORWARD_HANDLER, FORWARD_WORKER_MANIFEST, cls="Staged"
    )
    with live_server(tmp_path) as srv:
        srv.deploy(folder)

        async def all_at_once() -> list[httpx.Response]:
            limits = httpx.Limits(max_connections=400)
            async with httpx.AsyncClient(base_url=srv.url, limits=limits, timeout=60) as client:
                return list(
                    await asyncio.gather(
                        *(
                            client.post(
                                "/v1/functions/staged/invoke",
                                json={"x": [[float(i), -float(i)], [0.5, float(i)]]},
                            )
                            for i in range(400)
                        )
                    )
                )

        responses = asyncio.run(all_at_once())
        for i, response in enumerate(responses):
            assert response.status_code == 200, response.text
            assert response.json()["y"] == [[2.0 * i + 1, -2.0 * i + 1], [2.0, 2.0 * i + 1]]
        instances = srv.call(srv.registry.get("staged")).pool.loaded_instances()
        assert len(instances) == 1 and isinstance(instances[0], ProcessInstance)
        assert instances[0].stages  # the worker stages its batches itself (forward)
        assert instances[0].sent_ahead > 0  # batches went into the second arena


def test_the_spans_of_a_batch_sent_ahead_move_under_its_batch_span() -> None:
    from fnrt.loader.process import AHEAD_TRACE, reparented

    trace = ("ab" * 16, "cd" * 8)
    spans = [
        {"trace_id": AHEAD_TRACE[0], "span_id": "1" * 16, "parent_span_id": AHEAD_TRACE[1]},
        {"trace_id": AHEAD_TRACE[0], "span_id": "2" * 16, "parent_span_id": "1" * 16},
    ]
    moved = reparented(spans, trace)
    assert [s["trace_id"] for s in moved] == [trace[0]] * 2
    assert [s["parent_span_id"] for s in moved] == [trace[1], "1" * 16]  # the child keeps its own
    assert reparented(spans, None) == []  # the batch was not traced: nothing to record


def test_a_worker_whose_memory_watch_cannot_start_is_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker process was started; the thread that watches its memory then could
    not start (no thread left to this process: forced here, as nothing else makes
    Thread.start fail): the launch fails and the worker ends with it, its arenas gone
    (before, it ran on with nothing holding it)."""
    import threading

    import fnrt.loader.launch as launching

    loader, vm = _loader(tmp_path, memory_limit_bytes=1 << 30)
    started: list[object] = []

    def recorded(*args: object, **kwargs: object) -> object:
        started.append(start_worker(*args, **kwargs))  # type: ignore[arg-type]
        return started[-1]

    def refused(thread: threading.Thread) -> None:
        if thread.name.startswith("fnrt-rss-"):
            raise RuntimeError("can't start new thread")
        start(thread)

    start = threading.Thread.start
    monkeypatch.setattr(launching, "start_worker", recorded)
    monkeypatch.setattr(threading.Thread, "start", refused)
    with made_folders() as made, pytest.raises(RuntimeError, match="can't start new thread"):
        launch(loader, IsolationMode.PROCESS, vm, ThreadPoolExecutor(1))  # type: ignore[arg-type]
    monkeypatch.undo()
    [worker] = started
    assert worker.process.poll() is not None  # type: ignore[attr-defined]
    [arenas] = [folder for folder in made if folder.parent == shm_dir()]
    assert not arenas.exists()
