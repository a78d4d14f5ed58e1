"""Batching, priorities, deadlines, overload, result cache and instances over a real server."""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from fnrt.functions.manifest import IsolationMode
from fnrt.loader.instance import Instance
from fnrt.loader.memory import Holders, MemoryBudget, room_maker
from fnrt.runtime import scheduler as sched
from fnrt.runtime.clock import ManualClock
from support import (
    LiveServer,
    gate,
    gates,
    live_server,
    make_node,
    packed,
    wait_until,
    write_function,
)

RECORDING = """
import threading
import fnrt_test_gates

fnrt_test_gates.calls = getattr(fnrt_test_gates, "calls", [])
fnrt_test_gates.active = getattr(fnrt_test_gates, "active", [0, 0])  # now, most at once
lock = threading.Lock()

class Recording:
    def load(self, artifacts, device):
        fnrt_test_gates.loads.append(1)

    def __call__(self, batch):
        with lock:
            fnrt_test_gates.active[0] += 1
            fnrt_test_gates.active[1] = max(fnrt_test_gates.active)
        fnrt_test_gates.calls.append([float(r["x"][0, 0]) for r in batch])
        fnrt_test_gates.gate("entered").set()
        fnrt_test_gates.gate("release").wait(30)
        with lock:
            fnrt_test_gates.active[0] -= 1
        return [{"y": r["x"]} for r in batch]
"""

MANIFEST = """
name = "{name}"
handler = "handler:Recording"

[inputs]
x = {{ dtype = "float32", shape = [1, 4] }}

[batching]
max_batch_size = {max_batch_size}
max_wait_ms = {max_wait_ms}

[scaling]
max_queue = {max_queue}
max_instances = {max_instances}
scale_up_after_ms = 0
scale_down_after_s = 30
keep_alive_s = 300

[requests]
aging_ms = 60000

[result_cache]
enabled = {cache}
ttl_s = 10
"""


def deploy(srv: LiveServer, tmp: Path, name: str = "rec", **fields: object) -> None:
    values = {
        "max_batch_size": 4,
        "max_wait_ms": 0,
        "max_queue": 64,
        "max_instances": 1,
        "cache": "false",
        **fields,
    }
    folder = write_function(tmp / "src", name, RECORDING, MANIFEST, **values)
    srv.deploy(folder)


def body(v: float) -> dict[str, list[list[float]]]:
    return {"x": [[v, 0, 0, 0]]}


def calls() -> list[list[float]]:
    return list(getattr(gates, "calls", []))


def reset_calls() -> None:
    gates.calls = []  # type: ignore[attr-defined]
    gates.active = [0, 0]  # type: ignore[attr-defined]


def test_flush_by_size_and_by_time(tmp_path: Path) -> None:
    reset_calls()
    gate("release").set()
    clock = ManualClock()
    with (
        live_server(tmp_path, clock=clock) as srv,
        srv.client() as c,
        ThreadPoolExecutor(8) as pool,
    ):
        deploy(srv, tmp_path, max_batch_size=4, max_wait_ms=50)
        scheduler = srv.call(srv.registry.get("rec"))
        srv.call(sched.warm(scheduler))
        # two requests: not full, so they wait for max_wait_ms of clock time
        first = [pool.submit(c.post, "/v1/functions/rec/invoke", json=body(i)) for i in (1, 2)]
        wait_until(lambda: scheduler.batcher.queued == 2)
        assert calls() == []
        clock.advance(0.049)
        assert calls() == [] and scheduler.batcher.queued == 2
        clock.advance(0.002)
        assert [f.result().status_code for f in first] == [200, 200]
        assert sorted(calls()[0]) == [1.0, 2.0]
        # a full batch leaves at once, without the clock moving
        full = [
            pool.submit(c.post, "/v1/functions/rec/invoke", json=body(i)) for i in range(10, 14)
        ]
        assert [f.result().status_code for f in full] == [200] * 4
        assert sorted(calls()[1]) == [10.0, 11.0, 12.0, 13.0]
        assert c.get("/v1/functions/rec").json()["instance"]["batch_sizes"] == {"2": 1, "4": 1}


def test_priority_ordering_under_a_backlog(tmp_path: Path) -> None:
    reset_calls()
    with live_server(tmp_path) as srv, srv.client() as c, ThreadPoolExecutor(8) as pool:
        deploy(srv, tmp_path, max_batch_size=1)
        scheduler = srv.call(srv.registry.get("rec"))
        blocker = pool.submit(c.post, "/v1/functions/rec/invoke", json=body(0))
        assert gate("entered").wait(10)
        futures = []
        for i, prio in enumerate(["low", "low", "normal", "low", "high", "normal"], start=1):
            futures.append(
                pool.submit(
                    c.post,
                    "/v1/functions/rec/invoke",
                    json=body(i),
                    headers={"x-fnrt-priority": prio},
                )
            )
            wait_until(lambda n=i: scheduler.batcher.queued == n)
        assert c.get("/v1/functions/rec").json()["instance"]["queued_by_priority"] == {
            "high": 1,
            "normal": 2,
            "low": 3,
            "job": 0,
        }
        gate("release").set()
        assert blocker.result().status_code == 200
        assert [f.result().status_code for f in futures] == [200] * 6
        assert [batch[0] for batch in calls()] == [0, 5, 3, 6, 1, 2, 4]
        r = c.post("/v1/functions/rec/invoke", json=body(0), headers={"x-fnrt-priority": "urgent"})
        assert r.status_code == 400 and "not high, normal or low" in r.json()["error"]


def test_deadline_expiry_drops_before_compute_with_504(tmp_path: Path) -> None:
    reset_calls()
    clock = ManualClock()
    with (
        live_server(tmp_path, clock=clock) as srv,
        srv.client() as c,
        ThreadPoolExecutor(4) as pool,
    ):
        deploy(srv, tmp_path, max_batch_size=1)
        scheduler = srv.call(srv.registry.get("rec"))
        blocker = pool.submit(c.post, "/v1/functions/rec/invoke", json=body(0))
        assert gate("entered").wait(10)
        late = pool.submit(
            c.post, "/v1/functions/rec/invoke", json=body(7), headers={"x-fnrt-timeout-ms": "50"}
        )
        patient = pool.submit(
            c.post, "/v1/functions/rec/invoke", json=body(8), headers={"x-fnrt-timeout-ms": "5000"}
        )
        wait_until(lambda: scheduler.batcher.queued == 2)
        clock.advance(0.05)
        r = late.result()
        assert r.status_code == 504 and "deadline passed" in r.json()["error"]
        gate("release").set()
        assert blocker.result().status_code == 200 and patient.result().status_code == 200
        assert [b[0] for b in calls()] == [0, 8]  # 7 was never computed
        assert c.get("/v1/functions/rec").json()["instance"]["expired"] == 1
        assert srv.node.admission.queued == 0  # the expired request left the count too
        assert (
            c.post(
                "/v1/functions/rec/invoke", json=body(0), headers={"x-fnrt-timeout-ms": "soon"}
            ).status_code
            == 400
        )


def test_429_under_overload_while_health_answers(tmp_path: Path) -> None:
    reset_calls()
    node = make_node(tmp_path)
    node.admission.max_queued = 5  # the node-wide bound
    with (
        live_server(tmp_path, node=node) as srv,
        srv.client() as c,
        ThreadPoolExecutor(16) as pool,
    ):
        deploy(srv, tmp_path, "a", max_batch_size=1, max_queue=3)
        deploy(srv, tmp_path, "b", max_batch_size=1, max_queue=10)
        a = srv.call(node.registry.get("a"))
        b = srv.call(node.registry.get("b"))
        held = [pool.submit(c.post, "/v1/functions/a/invoke", json=body(0))]
        assert gate("entered").wait(10)
        held += [pool.submit(c.post, "/v1/functions/a/invoke", json=body(i)) for i in range(3)]
        wait_until(lambda: a.batcher.queued == 3)
        r = c.post("/v1/functions/a/invoke", json=body(9))
        assert r.status_code == 429 and "a' has 3 requests queued" in r.json()["error"]
        assert int(r.headers["retry-after"]) >= 1
        held.append(pool.submit(c.post, "/v1/functions/b/invoke", json=body(0)))
        # loaded, running, held
        wait_until(lambda: b.batcher.queued == 0 and sched.activity(b).busy)
        held += [pool.submit(c.post, "/v1/functions/b/invoke", json=body(i)) for i in (1, 2)]
        wait_until(lambda: b.batcher.queued == 2)
        assert node.admission.queued == 5  # 3 for a, 2 for b
        r = c.post("/v1/functions/b/invoke", json=body(9))
        assert r.status_code == 429 and "the server has 5 requests queued" in r.json()["error"]
        assert c.get("/healthz").status_code == 200 and c.get("/readyz").status_code == 200
        gate("release").set()
        assert all(f.result().status_code == 200 for f in held)
        assert node.admission.queued == 0


def test_result_cache_hit_and_ttl(tmp_path: Path) -> None:
    reset_calls()
    gate("release").set()
    clock = ManualClock()
    with live_server(tmp_path, clock=clock) as srv, srv.client() as c:
        deploy(srv, tmp_path, cache="true")
        first = c.post("/v1/functions/rec/invoke", json=body(3))
        second = c.post("/v1/functions/rec/invoke", json=body(3))
        assert first.json() == second.json()
        assert "x-fnrt-cache" not in first.headers and second.headers["x-fnrt-cache"] == "hit"
        assert len(calls()) == 1  # the hit never reached the queue
        assert c.post("/v1/functions/rec/invoke", json=body(4)).headers.get("x-fnrt-cache") is None
        clock.advance(10)
        assert "x-fnrt-cache" not in c.post("/v1/functions/rec/invoke", json=body(3)).headers
        assert len(calls()) == 3
        cache = c.get("/v1/functions/rec").json()["instance"]["result_cache"]
        assert cache["hits"] == 1 and cache["entries"] == 2


def test_scale_up_to_max_instances_and_back_down(tmp_path: Path) -> None:
    reset_calls()
    clock = ManualClock()
    with (
        live_server(tmp_path, clock=clock) as srv,
        srv.client() as c,
        ThreadPoolExecutor(8) as pool,
    ):
        deploy(srv, tmp_path, max_batch_size=1, max_instances=2)
        scheduler = srv.call(srv.registry.get("rec"))
        futures = [pool.submit(c.post, "/v1/functions/rec/invoke", json=body(i)) for i in range(4)]
        # the queue stayed deep: a second instance
        wait_until(lambda: scheduler.pool.instances == 2)
        wait_until(lambda: gates.active[1] == 2)  # type: ignore[attr-defined]  # both ran at once
        gate("release").set()
        assert [f.result().status_code for f in futures] == [200] * 4
        assert len(gates.loads) == 2
        assert c.get("/v1/functions/rec").json()["instance"]["instances"] == 2
        clock.advance(30)  # the extra instance idles out first
        srv.call(srv.node.sweeper.sweep())
        assert scheduler.pool.instances == 1
        clock.advance(270)  # then the last one, after keep_alive_s
        srv.call(srv.node.sweeper.sweep())
        assert scheduler.pool.instances == 0 and scheduler.pool.state.value == "cold"


ADAPTIVE = """
name = "adaptive"
handler = "handler:Recording"

[inputs]
x = {{ dtype = "float32", shape = [1, 4] }}

[batching]
mode = "adaptive"
target_p99_ms = 100
max_batch_size = 16
"""


def test_adaptive_refuses_what_cannot_finish_in_time(tmp_path: Path) -> None:
    reset_calls()
    with live_server(tmp_path) as srv, srv.client() as c, ThreadPoolExecutor(16) as pool:
        folder = write_function(tmp_path / "src", "adaptive", RECORDING, ADAPTIVE)
        srv.deploy(folder)
        scheduler = srv.call(srv.registry.get("adaptive"))
        for n in (1, 2, 4, 8):  # what the handler has been measured to cost: 10 ms an item
            scheduler.batcher.cost.observe(n, 0.010 * n)
        blocker = pool.submit(c.post, "/v1/functions/adaptive/invoke", json=body(0))
        assert gate("entered").wait(10)
        queued = [
            pool.submit(c.post, "/v1/functions/adaptive/invoke", json=body(i)) for i in range(5)
        ]
        wait_until(lambda: scheduler.batcher.queued == 5)
        # batches of 5 (50 ms) fit half the target; 5 ahead + this one = 2 batches = 100 ms: fits
        assert (
            c.get("/v1/functions/adaptive").json()["instance"]["cost_model"]["per_item_ms"] == 10.0
        )
        more = [
            pool.submit(c.post, "/v1/functions/adaptive/invoke", json=body(i)) for i in range(5)
        ]
        wait_until(lambda: scheduler.batcher.queued == 10)
        r = c.post("/v1/functions/adaptive/invoke", json=body(99))  # 3 batches = 150 ms > 100
        assert r.status_code == 503
        assert (
            "cannot answer within 100 ms" in r.json()["error"] and r.json()["expected_ms"] == 150.0
        )
        # a job's block has no latency target: it queues behind them all the same
        record = {"x": np.array([[7.0, 0, 0, 0]], np.float32)}

        async def block() -> Any:
            return await sched.submit_block(scheduler, [record])

        assert srv.loop is not None
        job = asyncio.run_coroutine_threadsafe(block(), srv.loop)
        wait_until(lambda: scheduler.batcher.queued == 11)
        gate("release").set()
        assert all(f.result().status_code == 200 for f in [blocker, *queued, *more])
        assert job.result(10)[0]["y"].tolist() == [[7.0, 0, 0, 0]]


def test_a_memory_budget_leaves_a_version_held_by_min_instances_loaded(tmp_path: Path) -> None:
    """``[scaling] min_instances`` keeps a version loaded (the sweep never unloads it):
    a load short of room evicts others, never it, and goes over the budget if it must."""
    holders = Holders()
    memory = MemoryBudget(1000, holders)
    clock = ManualClock()

    def version(name: str, min_instances: int, size: int) -> sched.Scheduler:
        manifest = 'name = "{name}"\nhandler = "handler:Echo"\n\n[scaling]\n'
        manifest += f"min_instances = {min_instances}\n"
        vm = packed(write_function(tmp_path, name, manifest=manifest))[0]

        def load(v: Any, executor: ThreadPoolExecutor) -> Instance:
            timings = {"fetch_s": 0.0, "verify_s": 0.0, "load_s": 0.0, "total_s": 0.0}
            return Instance(
                v, lambda batch: [{"y": 1} for _ in batch], executor, None, timings, size
            )

        s = sched.Scheduler(
            vm,
            load,
            clock,
            make_room=room_maker(memory, None),
            isolation=IsolationMode.THREAD,
        )
        s.pool.holding = functools.partial(holders.holding, s)
        return s

    async def scenario() -> None:
        kept, idle, new = version("kept", 1, 500), version("idle", 0, 400), version("new", 0, 500)
        for s in (kept, idle):  # kept the least recently used
            await sched.warm(s)
            clock.advance(10)
        await sched.warm(new)  # 900 held: room for 500 more takes idle's, never kept's
        assert kept.pool.instances == 1 and idle.pool.instances == 0
        for s in (kept, idle, new):
            await sched.close(s)

    asyncio.run(scenario())
