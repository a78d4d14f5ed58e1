"""The batcher's stage-ahead: while a batch computes, the next full batch is staged."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from fnrt.runtime import scheduler as sched
from support import gate, live_server, wait_until, write_function

HANDLER = """
import fnrt_test_gates


class Staged:
    def load(self, artifacts, device):
        self.batches = []
        fnrt_test_gates.track(self)

    def forward(self, inputs):
        x = inputs["x"]
        self.batches.append(x.shape[0])
        if float(x[0, 0]) < 0:  # a batch led by a negative value holds until let go
            fnrt_test_gates.gate("hold").wait(30)
        return {"y": x * 2}
"""

MANIFEST = """
name = "{name}"
handler = "handler:Staged"

[inputs]
x = {{ dtype = "float32", shape = [-1, 2] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 2] }}

[batching]
max_batch_size = 4
max_wait_ms = 1

[isolation]
mode = "thread"
timeout_s = {timeout_s}
"""


def _post(url: str, value: float) -> httpx.Response:
    return httpx.post(f"{url}/v1/functions/staged/invoke", json={"x": [[value, 1.0]]}, timeout=30)


def _deploy(srv: Any, tmp_path: Path, timeout_s: float = 0) -> Any:
    folder = write_function(tmp_path / "src", "staged", HANDLER, MANIFEST, timeout_s=timeout_s)
    srv.deploy(folder)
    assert _post(srv.url, 1.0).json()["y"] == [[2.0, 2.0]]  # loaded
    return srv.call(srv.registry.get("staged"))


def test_a_full_batch_is_staged_while_the_last_one_computes(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv, ThreadPoolExecutor(8) as pool:
        scheduler = _deploy(srv, tmp_path)
        (instance,) = scheduler.pool.loaded_instances()
        slots = instance.stager._slots
        held = pool.submit(_post, srv.url, -1.0)
        wait_until(lambda: any(slot.busy for slot in slots) and scheduler.batcher.queued == 0)
        full = [pool.submit(_post, srv.url, float(i)) for i in range(4)]
        wait_until(lambda: all(slot.busy for slot in slots))  # staged ahead
        assert scheduler.batcher.queued == 0
        rest = [pool.submit(_post, srv.url, float(10 + i)) for i in range(2)]
        wait_until(lambda: scheduler.batcher.queued == 2)  # below a full batch: nothing taken early
        gate("hold").set()
        assert held.result().json()["y"] == [[-2.0, 2.0]]
        for i, future in enumerate(full):
            assert future.result().json()["y"] == [[2.0 * i, 2.0]]
        for i, future in enumerate(rest):
            assert future.result().json()["y"] == [[2.0 * (10 + i), 2.0]]
        handler = instance.stager.forward.__self__
        assert handler.batches[:3] == [1, 1, 4]  # the load's, the held one, the staged four
        assert not any(slot.busy for slot in slots)


def _tasks_running(srv: Any) -> list[str]:
    """The names of the coroutines the server's event loop runs as tasks now."""

    async def names() -> list[str]:
        return [task.get_coro().__qualname__ for task in asyncio.all_tasks()]  # type: ignore[union-attr]

    return srv.call(names())


def test_a_lone_batch_runs_with_no_task_until_a_request_arrives_behind_it(
    tmp_path: Path,
) -> None:
    """A batch that emptied the queue runs in its slot's loop: no task for the run and
    none watching the queue (a lone request's cost), nor while fewer than a full batch
    arrive behind it; the request that makes a full one starts the watch, which stages
    it as before."""
    with live_server(tmp_path) as srv, ThreadPoolExecutor(8) as pool:
        scheduler = _deploy(srv, tmp_path)
        (instance,) = scheduler.pool.loaded_instances()
        slots = instance.stager._slots
        gate("hold").clear()
        held = pool.submit(_post, srv.url, -1.0)
        wait_until(lambda: any(slot.busy for slot in slots) and scheduler.batcher.queued == 0)
        running = _tasks_running(srv)
        assert "Batcher._run_batch" not in running and "Batcher._stage_ahead" not in running
        full = [pool.submit(_post, srv.url, float(i)) for i in range(3)]
        wait_until(lambda: scheduler.batcher.queued == 3)
        assert "Batcher._stage_ahead" not in _tasks_running(srv)  # below a full batch
        full.append(pool.submit(_post, srv.url, 3.0))
        wait_until(lambda: all(slot.busy for slot in slots))  # the watch staged them
        assert scheduler.batcher.queued == 0
        gate("hold").set()
        assert held.result().json()["y"] == [[-2.0, 2.0]]
        assert [f.result().json()["y"] for f in full] == [[[2.0 * i, 2.0]] for i in range(4)]
        assert "Batcher._stage_ahead" not in _tasks_running(srv)  # it ended with the run


def test_a_batch_staged_on_an_instance_that_is_lost_runs_on_its_replacement(
    tmp_path: Path,
) -> None:
    with live_server(tmp_path) as srv, ThreadPoolExecutor(8) as pool:
        scheduler = _deploy(srv, tmp_path, timeout_s=1)
        (instance,) = scheduler.pool.loaded_instances()
        held = pool.submit(_post, srv.url, -1.0)  # never let go: past its timeout
        wait_until(lambda: any(slot.busy for slot in instance.stager._slots))
        full = [pool.submit(_post, srv.url, float(i)) for i in range(4)]
        assert held.result().status_code == 504
        for i, future in enumerate(full):
            answer = future.result()
            assert answer.status_code == 200, answer.text
            assert answer.json()["y"] == [[2.0 * i, 2.0]]
        assert not instance.alive
        loaded = scheduler.pool.loaded_instances()
        assert loaded and loaded[0] is not instance


SLOW = """
import time


class Slow:
    def forward(self, inputs):
        time.sleep(0.02)
        return {"y": inputs["x"] * 2}
"""

SLOW_MANIFEST = (
    MANIFEST.replace("Staged", "Slow")
    + """
[scaling]
max_instances = 2
scale_up_after_ms = 20
max_queue = 4096
"""
)


def test_a_pipelined_function_still_scales_up_under_load(tmp_path: Path) -> None:
    """The stage-ahead loop keeps serving without going back to the batcher's own loop,
    so it asks for another instance itself (a deep queue must not stay on one)."""
    with live_server(tmp_path) as srv, ThreadPoolExecutor(64) as pool:
        folder = write_function(tmp_path / "src", "staged", SLOW, SLOW_MANIFEST, timeout_s=0)
        srv.deploy(folder)
        scheduler = srv.call(srv.registry.get("staged"))
        calls = [pool.submit(_post, srv.url, float(i)) for i in range(400)]
        wait_until(lambda: scheduler.pool.instances == 2, timeout_s=20)
        assert all(call.result().status_code == 200 for call in calls)


def test_after_job_records_alone_live_requests_are_not_staged_behind_more_jobs(
    tmp_path: Path,
) -> None:
    """With no live traffic, blocks of job records are staged ahead like any batch; while
    live requests arrive, nothing is staged after a batch of job records alone, so the
    slot yields to the live requests after it, as it does without the pipeline."""
    import numpy as np

    def block(first: float) -> list[dict[str, Any]]:
        return [{"x": np.array([[first, 1.0]], np.float32)}] + [
            {"x": np.array([[float(i), 1.0]], np.float32)} for i in range(3)
        ]

    with live_server(tmp_path) as srv, ThreadPoolExecutor(8) as pool:
        scheduler = _deploy(srv, tmp_path)  # one live call: long enough ago below
        (instance,) = scheduler.pool.loaded_instances()
        slots = instance.stager._slots

        async def submit(records: list[dict[str, Any]]) -> Any:
            return await sched.submit_block(scheduler, records)

        # no live arrivals lately: a second block is staged while the first holds

        time.sleep(1.5)
        gate("hold").clear()
        held = pool.submit(srv.call, submit(block(-1.0)))
        wait_until(lambda: any(slot.busy for slot in slots) and scheduler.batcher.queued == 0)
        behind = pool.submit(srv.call, submit(block(5.0)))
        wait_until(lambda: all(slot.busy for slot in slots))
        gate("hold").set()
        assert len(held.result()) == 4 and len(behind.result()) == 4

        # live requests arriving (the rate estimate is a slow mean of the gaps: many
        # of them): after a held block of jobs, nothing is staged ahead
        answers = list(pool.map(lambda i: _post(srv.url, float(i)), range(60)))
        assert all(a.status_code == 200 for a in answers)
        assert scheduler.batcher.arrivals.rate_per_s(scheduler.clock.now()) > 1.0
        gate("hold").clear()
        held = pool.submit(srv.call, submit(block(-1.0)))
        wait_until(lambda: any(slot.busy for slot in slots) and scheduler.batcher.queued == 0)
        live = [pool.submit(_post, srv.url, float(i)) for i in range(4)]
        wait_until(lambda: scheduler.batcher.queued == 4)
        time.sleep(0.2)
        assert sum(slot.busy for slot in slots) == 1
        gate("hold").set()
        assert len(held.result()) == 4
        assert [f.result().json()["y"] for f in live] == [[[2.0 * i, 2.0]] for i in range(4)]


TWO = """
class Two:
    def forward(self, inputs):
        return {"y": inputs["x"] + inputs["k"][:, None]}
"""

TWO_MANIFEST = """
name = "{name}"
handler = "handler:Two"

[inputs]
x = {{ dtype = "float32", shape = [-1, 2] }}
k = {{ dtype = "float32", shape = [-1] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 2] }}

[isolation]
mode = "{mode}"
"""


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_request_whose_inputs_disagree_on_rows_is_its_own_422(tmp_path: Path, mode: str) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        folder = write_function(tmp_path / "src", "two", TWO, TWO_MANIFEST, mode=mode)
        srv.deploy(folder)
        url = "/v1/functions/two/invoke"
        good = {"x": [[1.0, 2.0]], "k": [10.0]}
        assert c.post(url, json=good).json()["y"] == [[11.0, 12.0]]
        bad = c.post(url, json={"x": [[1.0, 2.0], [3.0, 4.0]], "k": [1.0, 2.0, 3.0]})
        assert bad.status_code == 422, bad.text
        assert "'k' has 3 rows and 'x' 2" in bad.text
        assert c.post(url, json=good).status_code == 200  # nothing else failed


SLEEPY = """
import time


class Sleepy:
    def forward(self, inputs):
        x = inputs["x"]
        if float(x[0, 0]) < 0:  # a batch led by a negative value takes that many seconds
            time.sleep(-float(x[0, 0]))
        return {"y": x * 2}
"""


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_request_that_would_expire_behind_the_running_batch_is_not_sent_ahead(
    tmp_path: Path, mode: str
) -> None:
    """A batch sent (or staged) ahead runs the moment the one computing ends, with no
    further look at deadlines; so a request whose deadline may pass before then (by
    what batches have taken) stays queued, and is answered 504 at its deadline, not
    200 after the batch ahead of it."""
    manifest = (
        MANIFEST.replace("Staged", "Sleepy")
        .replace('mode = "thread"', f'mode = "{mode}"')
        .replace("max_batch_size = 4", "max_batch_size = 1")  # one request: a full batch
    )
    with live_server(tmp_path) as srv, ThreadPoolExecutor(4) as pool:
        folder = write_function(tmp_path / "src", "staged", SLEEPY, manifest, timeout_s=0)
        srv.deploy(folder)
        for _ in range(2):  # loaded; its batches take 0.6 s
            assert _post(srv.url, -0.6).status_code == 200
        scheduler = srv.call(srv.registry.get("staged"))
        slow = pool.submit(_post, srv.url, -0.6)
        wait_until(lambda: scheduler.pool.running == 1)
        sent = time.monotonic()
        late = httpx.post(
            f"{srv.url}/v1/functions/staged/invoke",
            json={"x": [[3.0, 1.0]]},
            headers={"x-fnrt-timeout-ms": "150"},
            timeout=30,
        )
        waited = time.monotonic() - sent
        assert late.status_code == 504, late.text
        assert waited < 0.45  # at its deadline, not after the batch ahead of it
        assert slow.result().status_code == 200
        assert _post(srv.url, 4.0).json()["y"] == [[8.0, 2.0]]  # and serving on


def test_a_request_sent_ahead_whose_deadline_passed_meanwhile_is_a_504(tmp_path: Path) -> None:
    """Where the prediction was wrong (a batch far slower than those before it), a
    request sent ahead is answered 504 when its turn comes, not with a late 200."""
    manifest = MANIFEST.replace("Staged", "Sleepy").replace(
        "max_batch_size = 4", "max_batch_size = 1"
    )
    with live_server(tmp_path) as srv, ThreadPoolExecutor(4) as pool:
        folder = write_function(tmp_path / "src", "staged", SLEEPY, manifest, timeout_s=0)
        srv.deploy(folder)
        for _ in range(3):  # fast batches: nothing predicts the slow one
            assert _post(srv.url, 1.0).status_code == 200
        scheduler = srv.call(srv.registry.get("staged"))
        slow = pool.submit(_post, srv.url, -1.0)
        wait_until(lambda: scheduler.pool.running == 1)
        late = httpx.post(
            f"{srv.url}/v1/functions/staged/invoke",
            json={"x": [[3.0, 1.0]]},
            headers={"x-fnrt-timeout-ms": "200"},
            timeout=30,
        )
        assert late.status_code == 504, late.text
        assert slow.result().status_code == 200
        assert _post(srv.url, 4.0).json()["y"] == [[8.0, 2.0]]
