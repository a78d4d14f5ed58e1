"""The sweep: what it does for functions at work, and that idle ones cost it nothing."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fnrt.loader.memory import MemoryBudget, device_bytes, room_maker
from fnrt.runtime import scheduler as sched
from fnrt.runtime.clock import ManualClock
from fnrt.runtime.prewarm.keeper import Keeper
from fnrt.runtime.sweeper import Sweeper, unheld_bytes
from support import (
    ECHO_MANIFEST,
    WEIGHTED_HANDLER,
    WEIGHTED_MANIFEST,
    OnGpu,
    live_server,
    make_node,
    publish,
    write_function,
)

X = [[1.0, 2.0, 3.0, 4.0]]


def test_a_function_scaled_to_zero_stays_cold_until_it_is_called_again(tmp_path: Path) -> None:
    """Sweeps leave a cold function alone (it is passed by: what that saves a second,
    bench/scale.py measures) and look at it again once it is called: it is scaled to
    zero again when its plan says."""
    clock = ManualClock(start=0.0)
    keeper = Keeper(tmp_path / "history.json", wall=lambda: 1_800_000_000.0 + clock.now())
    node = make_node(tmp_path, clock, keeper=keeper)
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        # a cold start worth nothing: auto unloads it once idle and plans no pre-warm
        folder = write_function(
            tmp_path, "f", manifest=ECHO_MANIFEST + "cold_start_price_gb_s = 0\n"
        )
        srv.deploy(folder)
        stats = srv.call(node.registry.get("f")).stats

        def call_and_sweep_it_down() -> None:
            r = c.post("/v1/functions/f/invoke", json={"x": X})
            assert r.status_code == 200 and r.headers["x-fnrt-cold-start"]  # a cold start
            assert srv.call(node.sweeper.sweep()) == []  # its minute is not over
            assert c.get("/v1/functions/f").json()["instance"]["state"] == "warm"
            clock.advance(61)
            assert srv.call(node.sweeper.sweep()) == ["f"]
            assert c.get("/v1/functions/f").json()["instance"]["state"] == "cold"

        call_and_sweep_it_down()
        assert (stats.loads, stats.unloads) == (1, 1)
        for _ in range(5):  # cold, nothing planned: nothing to do
            clock.advance(1)
            assert srv.call(node.sweeper.sweep()) == []
        assert (stats.loads, stats.unloads) == (1, 1)
        call_and_sweep_it_down()  # called again: looked at, and scaled to zero again
        assert (stats.loads, stats.unloads) == (2, 2)
        metrics = c.get("/metrics").text
        assert 'fnrt_evictions_total{reason="idle"} 2.0' in metrics


def test_a_cold_version_kept_for_a_rollback_is_still_retired_when_its_window_passes(
    tmp_path: Path,
) -> None:
    """The sweep looks only at functions that may need it (a version holding or loading
    an instance, one kept for a rollback, a plan pending), from sets kept as they
    change: a version kept for a rollback that never loaded is one of them."""
    clock = ManualClock(start=0.0)
    node = make_node(tmp_path, clock)
    with live_server(tmp_path, node=node) as srv:
        versions = []
        for keep_alive_s in (300, 301):  # two versions, neither called
            folder = write_function(
                tmp_path / f"v{keep_alive_s}", "kept", keep_alive_s=keep_alive_s
            )
            versions.append(srv.deploy(folder).version)
        entry = srv.call(node.registry.entry("kept"))
        held = lambda: set(entry.schedulers)  # noqa: E731
        for scheduler in entry.schedulers.values():  # (a deploy loads its version ahead)
            srv.call(sched.scale_to_zero(scheduler, clock.now(), force=True))
        assert versions[0] in held()  # kept for a rollback, cold, as the other version
        srv.call(node.sweeper.sweep())
        assert versions[0] in held()
        clock.advance(601)  # past rollback_window_s (600 by default)
        srv.call(node.sweeper.sweep())
        assert held() == {versions[1]}


def test_a_restarted_node_serves_what_it_learned_and_reads_the_rest_on_call(
    tmp_path: Path,
) -> None:
    from fnrt.functions.routing import Routing

    wall = [1_800_000_000.0]
    keeper = Keeper(tmp_path / "history.json", wall=lambda: wall[0])
    node = make_node(tmp_path, keeper=keeper)
    for name, extra in (("learned", ""), ("early", "load_at_start = true\n"), ("idle", "")):
        folder = write_function(tmp_path / "src", name)
        if extra:
            toml = folder / "fnrt.toml"
            toml.write_text(toml.read_text().replace("[scaling]\n", f"[scaling]\n{extra}"))
        vm = publish(node.repository, folder)
        node.repository.put_version(vm)
        node.repository.update_routing(name, lambda _, v=vm.version: Routing.first(v, "t"))
    for _ in range(3):
        keeper.invoked("learned")
        wall[0] += 600
    keeper.save()
    restarted = make_node(tmp_path, keeper=Keeper(tmp_path / "history.json"))
    with live_server(tmp_path, node=restarted) as srv, srv.client() as c:
        held = sorted(e.name for e in restarted.registry.entries())
        assert held == ["early", "learned"]  # "idle" costs this node nothing yet
        assert c.post("/v1/functions/idle/invoke", json={"x": X}).status_code == 200
        assert sorted(e.name for e in restarted.registry.entries()) == ["early", "idle", "learned"]


def test_the_sweep_saves_every_history_while_calls_keep_coming(tmp_path: Path) -> None:
    """The sweep writes the histories on a thread while the event loop records calls.
    Before, that thread read the histories as the loop changed them: a function whose
    first minute the loop committed meanwhile failed the save (KeyError), and the
    histories went unsaved. Now it writes a snapshot taken on the loop."""
    clock = ManualClock(start=0.0)
    wall = [1_800_000_000.0]
    keeper = Keeper(tmp_path / "history.json", wall=lambda: wall[0])
    node = make_node(tmp_path, clock, keeper=keeper)
    calling = True

    async def calls() -> int:
        minute = 0
        while calling and minute < 2000:  # each minute a new function, the last one's
            # first minute committed
            minute += 1
            wall[0] += 60
            keeper.invoked(f"f{minute}")
            keeper.invoked(f"f{minute - 1}")
            await asyncio.sleep(0)
        return minute

    async def sweeps() -> int:
        nonlocal calling
        caller = asyncio.ensure_future(calls())
        for _ in range(10):
            clock.advance(61)  # past the sweep's save interval: each sweep saves
            await node.sweeper.sweep()
        calling = False
        return await caller

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch at every chance: the race, every time
    try:
        minutes = asyncio.run(sweeps())
    finally:
        sys.setswitchinterval(switch)
    saved = json.loads((tmp_path / "history.json").read_text())["functions"]
    assert len(saved) > 1 and set(saved) <= {f"f{m}" for m in range(minutes + 1)}


def test_the_memory_budget_evicts_by_plan_not_recency_and_says_why(tmp_path: Path) -> None:
    clock = ManualClock(start=0.0)
    wall = 1_800_000_000.0  # a minute boundary
    keeper = Keeper(tmp_path / "history.json", wall=lambda: wall + clock.now())
    node = make_node(tmp_path, clock, keeper=keeper)
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        for name in ("tick", "once", "new"):
            folder = write_function(tmp_path, name, manifest=ECHO_MANIFEST)
            srv.deploy(folder)
        tick, once = (srv.call(node.registry.get(n)) for n in ("tick", "once"))

        def call(name: str) -> None:
            assert c.post(f"/v1/functions/{name}/invoke", json={"x": X}).status_code == 200

        for _ in range(12):  # tick: every 3 minutes, its next call minutes away
            call("tick")
            clock.advance(3 * 60)
            srv.call(node.sweeper.sweep())
        call("tick")
        clock.advance(60)
        call("once")  # once: called a single time, after tick
        clock.advance(60)
        srv.call(node.sweeper.sweep())
        assert tick.pool.state.value == "warm" and once.pool.state.value == "warm"
        node.memory.budget_bytes = tick.resident_bytes + once.resident_bytes + 1  # two fit
        call("new")  # least recently used would drop tick; its plan says it is due
        assert tick.pool.state.value == "warm" and once.pool.state.value == "cold"
        metrics = c.get("/metrics").text
        assert 'fnrt_evictions_total{reason="budget"} 1.0' in metrics
        assert 'fnrt_load_stage_duration_seconds_count{stage="files"} 3.0' in metrics
        keep = c.get("/v1/functions/tick").json()["keep_alive"]
        assert keep["why"] == "cost" and keep["plan"].startswith("loaded minutes 1-")


def test_a_prewarm_whose_files_cannot_be_fetched_evicts_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A pre-warm whose plan fills the budget may evict instances worth less than it, but
    only once its files are here: a store that fails them fails the pre-warm first."""
    clock = ManualClock(start=0.0)
    wall = 1_800_000_000.0  # a minute boundary
    keeper = Keeper(tmp_path / "history.json", wall=lambda: wall + clock.now(), fill_memory=True)
    node = make_node(tmp_path, clock, keeper=keeper)
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        for name in ("idle", "ahead"):
            files = {"w.bin": bytes(1000)}
            srv.deploy(write_function(tmp_path, name, WEIGHTED_HANDLER, WEIGHTED_MANIFEST, files))
        idle, ahead = (srv.call(node.registry.get(n)) for n in ("idle", "ahead"))

        def call(name: str) -> None:
            assert c.post(f"/v1/functions/{name}/invoke", json={"x": X}).status_code == 200

        call("idle")  # once, long ago: worth nothing by now, kept while there is room
        for minute in range(1, 41):
            if minute % 5 == 0:
                call("ahead")  # every five minutes: its next call is due at minute 45
            clock.advance(60)
            srv.call(node.sweeper.sweep())
        srv.call(sched.scale_to_zero(ahead, clock.now(), force=True))
        assert idle.pool.state.value == "warm" and ahead.pool.state.value == "cold"
        # room for one of them (1,000 bytes of weights, 1,400 with its code), not two
        node.memory.budget_bytes = idle.resident_bytes + 500
        blob = node.repository.blob_path(ahead.version.artifacts["w"].digest)
        assert blob is not None
        blob.unlink()  # the store lost it
        with caplog.at_level(logging.WARNING, "fnrt.sweeper"):
            srv.call(node.sweeper.prewarm(ahead))
        assert idle.pool.state.value == "warm" and ahead.pool.state.value == "cold"
        assert "pre-warming ahead failed" in caplog.text


def test_an_idle_unload_under_a_fixed_keep_alive_is_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(start=0.0)
    node = make_node(tmp_path, clock)  # no keeper: the manifest's fixed keep-alive
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        folder = write_function(tmp_path, "fixed", manifest=ECHO_MANIFEST)
        srv.deploy(folder)
        assert c.post("/v1/functions/fixed/invoke", json={"x": X}).status_code == 200
        scheduler = srv.call(node.registry.get("fixed"))
        clock.advance(scheduler.version.manifest.scaling.keep_alive_s + 1)
        with caplog.at_level(logging.INFO, logger="fnrt.sweeper"):
            assert srv.call(node.sweeper.sweep()) == ["fixed"]
        assert scheduler.pool.state.value == "cold"
        assert 'fnrt_evictions_total{reason="idle"} 1.0' in c.get("/metrics").text
    assert "unloading fixed (reason: idle)" in caplog.text


def test_the_gpu_budgets_evictions_are_counted_as_the_hosts_are() -> None:
    """On a GPU node the GPU's budget is the one that binds: its evictions are counted
    (``fnrt_evictions_total{reason="budget"}``) and chosen by the plans, as the host's."""
    held = [OnGpu("a/v1", 10, 1.0, device_bytes=600)]
    host, gpu = MemoryBudget(1000, lambda: held), MemoryBudget(1000, lambda: held, device_bytes)
    counted: list[tuple[str, str]] = []

    def sweeper(keeper: Keeper | None) -> Sweeper:
        return Sweeper(
            None,  # type: ignore[arg-type]  # (the budgets' wiring alone)
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            host,
            ManualClock(),
            keeper,
            gpu_memory=gpu,
            evicted=lambda key, why: counted.append((key, why)),
        )

    planned = sweeper(Keeper(None))
    assert gpu.appraise == planned.appraise == host.appraise  # chosen by the plans
    host.appraise = gpu.appraise = None  # (the fakes here have no plan to read)
    asyncio.run(room_maker(host, gpu)("b/v1", 10, 500))  # room on the GPU: a goes
    assert held[0].evicted
    assert counted == [("a/v1", "budget")]


def test_a_prewarm_under_way_is_counted_once() -> None:
    """Pre-warms loading side by side count each other's bytes until each one's load
    holds its room in the budget, which counts it from then on: never twice."""
    memory = MemoryBudget(100, lambda: [])
    prewarming = {"a/v1": 40, "b/v1": 30}
    assert unheld_bytes(prewarming, memory.holding_room()) == 70  # neither holds room yet

    async def scenario() -> None:
        release = await memory.make_room("a/v1", 40)  # a's load holds its room now
        assert unheld_bytes(prewarming, memory.holding_room()) == 30
        assert memory.used_bytes() + unheld_bytes(prewarming, memory.holding_room()) == 70
        release()
        assert unheld_bytes(prewarming, memory.holding_room()) == 70

    asyncio.run(scenario())


def test_prewarms_started_together_choose_in_the_order_they_started(tmp_path: Path) -> None:
    """Two pre-warms with room for one: the one the sweep started first loads, though its
    files come in last. A minute's pre-warms take room in the order of the function
    table, as ``fnrt simulate`` takes them, not in the order their fetches end."""
    clock = ManualClock(start=0.0)
    node = make_node(tmp_path, clock)
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        for name in ("first", "second"):
            srv.deploy(write_function(tmp_path, name, manifest=ECHO_MANIFEST))
            assert c.post(f"/v1/functions/{name}/invoke", json={"x": X}).status_code == 200
        first, second = (srv.call(node.registry.get(n)) for n in ("first", "second"))
        for scheduler in (first, second):
            srv.call(sched.scale_to_zero(scheduler, clock.now(), force=True))
        sizes = [s.stats.last_load_bytes for s in (first, second)]
        node.memory.budget_bytes = max(sizes) + min(sizes) // 2  # room for one
        fetch = node.sweeper._loader.prefetch

        def slow_for_first(version: Any) -> Any:
            if version.name == "first":
                time.sleep(0.3)  # its files come in after the second's
            return fetch(version)

        node.sweeper._loader.prefetch = slow_for_first  # type: ignore[method-assign]

        async def both() -> None:
            started = [asyncio.create_task(node.sweeper.prewarm(s)) for s in (first, second)]
            await asyncio.gather(*started)

        srv.call(both())
        assert first.pool.state.value == "warm" and second.pool.state.value == "cold"


def test_a_prewarm_that_fails_before_its_turn_keeps_the_order_of_the_rest(
    tmp_path: Path,
) -> None:
    """Three pre-warms, room for one: the first's files come in last, the second's store
    fails at once, the third's are quick. The third still waits for the first: a
    failure in the middle does not cut the chain, nor does a pre-warm started twice
    (a sweep a second later, while it waits) fetch twice."""
    clock = ManualClock(start=0.0)
    node = make_node(tmp_path, clock)
    names = ("first", "second", "third")
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        for name in names:
            srv.deploy(write_function(tmp_path, name, manifest=ECHO_MANIFEST))
            assert c.post(f"/v1/functions/{name}/invoke", json={"x": X}).status_code == 200
        schedulers = [srv.call(node.registry.get(n)) for n in names]
        for scheduler in schedulers:
            srv.call(sched.scale_to_zero(scheduler, clock.now(), force=True))
        sizes = [s.stats.last_load_bytes for s in schedulers]
        node.memory.budget_bytes = max(sizes) + min(sizes) // 2  # room for one
        fetch = node.sweeper._loader.prefetch
        fetched: list[str] = []

        def prefetch(version: Any) -> Any:
            fetched.append(version.name)
            if version.name == "first":
                time.sleep(0.3)
            if version.name == "second":
                raise OSError("the store is down")
            return fetch(version)

        node.sweeper._loader.prefetch = prefetch  # type: ignore[method-assign]

        async def all_three() -> None:
            started = [asyncio.create_task(node.sweeper.prewarm(s)) for s in schedulers]
            started.append(asyncio.create_task(node.sweeper.prewarm(schedulers[0])))
            await asyncio.gather(*started)

        srv.call(all_three())
        states = [s.pool.state.value for s in schedulers]
        assert states == ["warm", "cold", "cold"]
        assert sorted(fetched) == sorted(names)  # the first, once
