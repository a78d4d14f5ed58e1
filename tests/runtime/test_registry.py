"""Lifecycle end to end: deploy -> invoke -> scale to zero (injected clock) -> invoke again."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fnrt.functions.errors import FunctionNotFound, Overloaded
from fnrt.functions.manifest import IsolationMode
from fnrt.functions.routing import Routing
from fnrt.loader.device import detect_device
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.repository import Repository
from fnrt.loader.stores import FileStore
from fnrt.runtime import deployer, views
from fnrt.runtime.clock import ManualClock
from fnrt.runtime.deployment import cut_over, store_version
from fnrt.runtime.events import NoEvents
from fnrt.runtime.intake import Admission
from fnrt.runtime.lookups import MISSING_FOR_S, READS_AT_ONCE, UNLISTED_WAITING
from fnrt.runtime.registry import Registry
from fnrt.runtime.scheduler import SchedulerFactory
from fnrt.runtime.sweeper import rollback_over
from support import (
    ECHO_HANDLER,
    gate,
    gates,
    live_server,
    make_node,
    publish,
    wait_until,
    write_function,
)

X = [[1.0, 2.0, 3.0, 4.0]]

TRACKED = """
import fnrt_test_gates

class Tracked:
    def load(self, artifacts, device):
        fnrt_test_gates.loads.append(1)
        fnrt_test_gates.track(self)
        self.weights = bytearray(8 * 1024 * 1024)   # memory the instance holds
        fnrt_test_gates.gate("load-started").set()
        fnrt_test_gates.gate("load").wait(30)

    def __call__(self, batch):
        return [{"y": r["x"] + 1} for r in batch]

    def unload(self):
        fnrt_test_gates.gate("unloaded").set()
"""

TRACKED_MANIFEST = """
name = "{name}"
handler = "handler:Tracked"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}

[scaling]
keep_alive_s = {keep_alive_s}
"""


def test_deploy_invoke_scale_to_zero_invoke_again(tmp_path: Path) -> None:
    clock = ManualClock()
    folder = write_function(
        tmp_path / "src", "tracked", TRACKED, TRACKED_MANIFEST, keep_alive_s=300
    )
    gate("load").set()
    with live_server(tmp_path, clock=clock) as srv:
        node = srv.node
        srv.deploy(folder)
        scheduler = srv.call(node.registry.get("tracked"))
        assert scheduler.pool.state.value == "cold"  # nothing loads at deploy
        assert gates.loads == []

        with srv.client() as c:
            assert c.post("/v1/functions/tracked/invoke", json={"x": X}).json() == {
                "y": [[2, 3, 4, 5]]
            }
            assert c.get("/v1/functions/tracked").json()["instance"]["state"] == "warm"

            clock.advance(299)
            assert srv.call(node.sweeper.sweep()) == []
            assert scheduler.pool.state.value == "warm"

            clock.advance(1)
            assert srv.call(node.sweeper.sweep()) == ["tracked"]
            assert gate("unloaded").is_set()
            described = c.get("/v1/functions/tracked").json()["instance"]
            assert described["state"] == "cold"
            assert described["unloads"] == 1
            gc.collect()
            assert [ref() for ref in gates.instances] == [None]  # the instance's memory is freed

            assert c.post("/v1/functions/tracked/invoke", json={"x": X}).status_code == 200
            assert len(gates.loads) == 2
            assert c.get("/v1/functions/tracked").json()["instance"]["loads"] == 2


def test_keep_alive_counts_from_the_last_request(tmp_path: Path) -> None:
    clock = ManualClock()
    folder = write_function(tmp_path / "src", "tracked", TRACKED, TRACKED_MANIFEST, keep_alive_s=60)
    gate("load").set()
    with live_server(tmp_path, clock=clock) as srv, srv.client() as c:
        srv.deploy(folder)
        c.post("/v1/functions/tracked/invoke", json={"x": X})
        clock.advance(50)
        c.post("/v1/functions/tracked/invoke", json={"x": X})
        clock.advance(50)
        assert srv.call(srv.node.sweeper.sweep()) == []
        clock.advance(10)
        assert srv.call(srv.node.sweeper.sweep()) == ["tracked"]


def test_concurrent_first_invokes_share_one_load(tmp_path: Path) -> None:
    folder = write_function(
        tmp_path / "src", "tracked", TRACKED, TRACKED_MANIFEST, keep_alive_s=300
    )
    with live_server(tmp_path) as srv:
        srv.deploy(folder)
        scheduler = srv.call(srv.registry.get("tracked"))
        with srv.client() as c, ThreadPoolExecutor(16) as pool:
            futures = [
                pool.submit(c.post, "/v1/functions/tracked/invoke", json={"x": [[i, 0, 0, 0]]})
                for i in range(16)
            ]
            assert gate("load-started").wait(30)
            wait_until(lambda: scheduler.batcher.queued == 16)  # all 16 arrived while loading
            assert scheduler.pool.state.value == "loading"
            gate("load").set()
            results = [f.result() for f in futures]
        assert [r.status_code for r in results] == [200] * 16
        assert sorted(r.json()["y"][0][0] for r in results) == [float(i + 1) for i in range(16)]
        assert len(gates.loads) == 1
        assert scheduler.stats.loads == 1


BROKEN_LOAD = """
class Broken:
    def load(self, artifacts, device):
        raise OSError("weights are corrupt")

    def __call__(self, batch):
        return [{"y": r["x"]} for r in batch]
"""


def test_a_load_failure_answers_500_and_the_next_request_tries_again(tmp_path: Path) -> None:
    manifest = TRACKED_MANIFEST.replace("Tracked", "Broken")
    folder = write_function(tmp_path / "src", "broken", BROKEN_LOAD, manifest, keep_alive_s=300)
    with live_server(tmp_path) as srv, srv.client() as c:
        srv.deploy(folder)
        for _ in range(2):
            r = c.post("/v1/functions/broken/invoke", json={"x": X})
            assert r.status_code == 500
            assert "failed to load: OSError: weights are corrupt" in r.json()["error"]
            assert r.json()["error_id"]
        assert c.get("/v1/functions/broken").json()["instance"]["load_failures"] == 2
        assert c.get("/healthz").status_code == 200


def test_redeploy_swaps_version_and_old_one_unloads_after_the_rollback_window(
    tmp_path: Path,
) -> None:
    gate("load").set()
    clock = ManualClock()
    node = make_node(tmp_path, clock)
    v1 = write_function(tmp_path / "v1", "tracked", TRACKED, TRACKED_MANIFEST, keep_alive_s=300)
    v2 = write_function(
        tmp_path / "v2",
        "tracked",
        TRACKED.replace("+ 1", "+ 2"),
        TRACKED_MANIFEST,
        keep_alive_s=300,
    )
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        first = srv.deploy(v1)
        assert c.post("/v1/functions/tracked/invoke", json={"x": X}).json()["y"] == [[2, 3, 4, 5]]
        second = srv.deploy(v2)
        assert second.version != first.version
        r = c.post("/v1/functions/tracked/invoke", json={"x": X})
        assert r.json()["y"] == [[3, 4, 5, 6]]
        assert r.headers["x-fnrt-version"] == second.version
        old = srv.call(node.registry.get_version("tracked", first.version))
        assert old.pool.state.value == "warm"  # kept for a rollback
        srv.call(node.sweeper.sweep())
        assert not gate("unloaded").is_set()
        clock.advance(601)  # past rollback_window_s (600 by default)
        srv.call(node.sweeper.sweep())
        assert gate("unloaded").wait(10)
        routing, _ = node.repository.get_routing("tracked")
        assert routing.traffic == {second.version: 100}
        assert routing.previous == (first.version,)


def test_a_failed_redeploy_of_the_version_kept_for_a_rollback_leaves_it_warm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deploying again the version kept warm for a rollback, whose checks fail this
    time (a warm-up that times out under load, say): the deploy is refused with the
    routing untouched, and so is the node: the version stays warm and kept for a
    rollback, not closed with the candidate that failed."""
    gate("load").set()
    clock = ManualClock()
    node = make_node(tmp_path, clock)
    v1 = write_function(tmp_path / "v1", "tracked", TRACKED, TRACKED_MANIFEST, keep_alive_s=300)
    v2 = write_function(tmp_path / "v2", "tracked", TRACKED.replace("+ 1", "+ 2"), TRACKED_MANIFEST)
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        first = srv.deploy(v1)
        assert c.post("/v1/functions/tracked/invoke", json={"x": X}).status_code == 200
        srv.deploy(v2)
        entry = srv.call(node.registry.entry("tracked"))
        kept = entry.schedulers[first.version]
        assert kept.pool.state.value == "warm" and first.version in entry.left_at

        async def failing(candidate: Any, loader: Any) -> dict[str, Any]:
            raise RuntimeError("the warm-up timed out")

        monkeypatch.setattr(deployer, "prepare", failing)
        with pytest.raises(RuntimeError, match="warm-up"):
            srv.deploy(v1)
        assert entry.schedulers.get(first.version) is kept
        assert not kept.batcher.closing and kept.pool.state.value == "warm"
        assert first.version in entry.left_at
        r = c.post("/v1/functions/tracked/rollback")
        assert r.status_code == 200, r.text
        assert c.post("/v1/functions/tracked/invoke", json={"x": X}).json()["y"] == [[2, 3, 4, 5]]
        assert entry.schedulers.get(first.version) is kept  # the warm one took it back


def test_a_second_node_serves_what_the_first_deployed(tmp_path: Path) -> None:
    gate("load").set()
    folder = write_function(
        tmp_path / "src", "tracked", TRACKED, TRACKED_MANIFEST, keep_alive_s=300
    )
    with live_server(tmp_path) as first:
        first.deploy(folder)
        with (
            live_server(tmp_path, node=make_node(tmp_path)) as second,
            second.client() as c,
        ):
            # routing without a wait answers only for a function already read here
            registry = second.node.registry
            assert registry.route_now("tracked") is None and registry.route_now("no-such") is None
            assert c.post("/v1/functions/tracked/invoke", json={"x": X}).status_code == 200
            assert [f["name"] for f in c.get("/v1/functions").json()["functions"]] == ["tracked"]
            assert registry.route_now("tracked") is second.call(registry.route("tracked"))


def test_a_slow_watch_read_never_undoes_a_newer_cut_over(tmp_path: Path) -> None:
    # A watch poll that read the routing before a deploy here must not apply that
    # older routing after the deploy's (the flake seen in CI under load).
    gate("load").set()
    node = make_node(tmp_path)
    folders = [
        write_function(
            tmp_path / f"v{add}",
            "tracked",
            TRACKED.replace("+ 1", f"+ {add}"),
            TRACKED_MANIFEST,
            keep_alive_s=300,
        )
        for add in (1, 2)
    ]
    with live_server(tmp_path, node=node) as srv:
        first = srv.deploy(folders[0])
        v2 = publish(node.repository, folders[1])
        read, write = node.repository.get_routing, node.repository.update_routing
        read_started, written, release = threading.Event(), threading.Event(), threading.Event()

        def slow_read(name: str) -> tuple[Routing, str]:
            result = read(name)
            if not read_started.is_set():
                read_started.set()
                release.wait(10)
            return result

        def noted_write(name: str, change: Callable[[Routing | None], Routing]) -> Routing:
            result = write(name, change)
            written.set()
            return result

        node.repository.get_routing = slow_read  # type: ignore[method-assign]
        node.repository.update_routing = noted_write  # type: ignore[method-assign]
        assert srv.loop is not None
        watch = asyncio.run_coroutine_threadsafe(node.registry.watch(), srv.loop)
        assert read_started.wait(10)  # the watch holds the routing naming the first version
        deploy = asyncio.run_coroutine_threadsafe(node.deployer.deploy(v2), srv.loop)
        assert written.wait(30)
        futures.wait([deploy], timeout=1)  # done at once unless it waits for the watch
        release.set()
        second = deploy.result(30)
        watch.result(30)
        primary = srv.call(node.registry.get("tracked"))
        assert second.version != first.version
        assert primary.version.version == second.version


def test_a_watch_reads_the_feed_then_only_the_functions_that_moved(tmp_path: Path) -> None:
    # 30 functions served here; another writer (a node, `fnrt deploy --store`) moves one.
    # The feed is read only when the test says: a sweeper's poll would add to the counts.
    node = make_node(tmp_path, watch_interval_s=3600)
    other = Repository(FileStore(tmp_path / "store"))  # the same store, another writer
    versions = {}
    for i in range(30):
        folder = write_function(tmp_path / "src", f"f{i}")
        versions[f"f{i}"] = publish(other, folder)
        other.put_version(versions[f"f{i}"])
        other.update_routing(f"f{i}", lambda _, v=versions[f"f{i}"].version: Routing({v: 100}))
    with live_server(tmp_path, node=node) as srv:
        listed, after = srv.call(views.summaries(node.registry))
        assert len(listed) == 30 and after is None and not node.registry.entries()  # not held
        for i in range(30):  # each called once: served here since
            srv.call(node.registry.get(f"f{i}"))
        store = node.repository.store
        before = store.requests.copy()
        assert srv.call(node.registry.watch()) == []
        assert store.requests - before == {"GetObject": 1}  # the feed, and nothing else

        tripled = ECHO_HANDLER.replace("2.0", "3.0")
        second = publish(other, write_function(tmp_path / "src2", "f7", tripled))
        other.put_version(second)
        other.update_routing("f7", lambda _: Routing({second.version: 100}))
        before = store.requests.copy()
        assert srv.call(node.registry.watch()) == ["f7"]
        assert store.requests - before == {"GetObject": 3}  # feed, f7's routing, its version
        assert srv.call(node.registry.get("f7")).version.version == second.version

        other.delete_function("f3")
        assert srv.call(node.registry.watch()) == ["f3"]
        assert "f3" not in [s["name"] for s in srv.call(views.summaries(node.registry))[0]]
        with srv.client() as c:
            gets = store.requests["GetObject"]
            assert (
                f'fnrt_store_requests_total{{operation="GetObject"}} {gets}.0'
                in c.get("/metrics").text
            )


def test_a_name_nobody_deployed_costs_one_store_read_until_the_feed_names_it(
    tmp_path: Path,
) -> None:
    # The cheapest request that cost the most: each invoke of an unknown name read the
    # store (a thread hop and a GET), one at a time behind every other first request.
    # The feed is read only when the test says (no sweeper's poll), on a manual clock.
    node = make_node(tmp_path, ManualClock(), watch_interval_s=3600)
    other = Repository(FileStore(tmp_path / "store"))  # another node, `fnrt deploy --store`
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        store = node.repository.store
        srv.call(node.registry.watch())  # the feed read once, as a node's sweep reads it
        before = store.requests.copy()
        for _ in range(20):
            answer = c.post("/v1/functions/later/invoke", json={"x": X})
            assert answer.status_code == 404
            assert answer.json()["function"] == "later"
        assert store.requests - before == {"GetObject": 1}  # its routing, once
        before = store.requests.copy()
        for path in ("/v2/models/later", "/v2/models/later/ready", "/v2/models/later/config"):
            for _ in range(5):  # the protocol's public model routes: the same note
                assert c.get(path).status_code == 404
        assert store.requests - before == {}
        vm = publish(other, write_function(tmp_path / "src", "later"))
        other.put_version(vm)
        other.update_routing("later", lambda _: Routing({vm.version: 100}))
        assert c.post("/v1/functions/later/invoke", json={"x": X}).status_code == 404
        srv.call(node.registry.watch())  # the feed names it: read again at the next call
        assert c.post("/v1/functions/later/invoke", json={"x": X}).status_code == 200
        # a version asked for by an id the store does not hold: one read too
        pinned = {"x-fnrt-version": "no-such-version"}
        before = store.requests.copy()
        for _ in range(10):
            answer = c.post("/v1/functions/later/invoke", json={"x": X}, headers=pinned)
            assert answer.status_code == 404 and answer.json()["version"] == "no-such-version"
            assert c.get("/v2/models/later/versions/no-such-version").status_code == 404
        assert store.requests - before == {"GetObject": 1}
        # an id no deploy could make is not looked for at all (a long one was a 500)
        long = {"x-fnrt-version": "v" * 3000}
        answer = c.post("/v1/functions/later/invoke", json={"x": X}, headers=long)
        assert answer.status_code == 404 and store.requests - before == {"GetObject": 1}
        # a deploy through this node reads the store whatever was noted
        assert c.post("/v1/functions/fresh/invoke", json={"x": X}).status_code == 404
        assert srv.deploy(write_function(tmp_path / "src2", "fresh")).version
        assert c.post("/v1/functions/fresh/invoke", json={"x": X}).status_code == 200


def test_the_protocols_model_metadata_reads_the_store_once_not_at_every_request(
    tmp_path: Path,
) -> None:
    # GET /v2/models/{name} listed the function's versions in the store (an S3 LIST) at
    # every request, and a version stored but served nowhere was read (a GET) at every
    # request for its metadata: public routes, open to any caller of a function
    # without invoke keys.
    clock = ManualClock()
    node = make_node(tmp_path, clock, watch_interval_s=3600)
    other = Repository(FileStore(tmp_path / "store"))  # another node
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        deployed = srv.deploy(write_function(tmp_path / "src", "m")).version
        stored = publish(other, write_function(tmp_path / "src2", "m", keep_alive_s=301))
        other.put_version(stored)  # stored, routed nowhere: served by no scheduler here
        store = node.repository.store
        before = store.requests.copy()
        for _ in range(10):
            listed = c.get("/v2/models/m").json()["versions"]
            assert sorted(listed) == sorted([deployed, stored.version])
            answer = c.get(f"/v2/models/m/versions/{stored.version}")
            assert answer.status_code == 200 and answer.json()["versions"] == [stored.version]
        assert store.requests - before == {"ListObjectsV2": 1, "GetObject": 1}
        clock.advance(MISSING_FOR_S)  # the list is kept 2 s; a version's manifest for good
        assert sorted(c.get("/v2/models/m").json()["versions"]) == sorted(listed)
        assert c.get(f"/v2/models/m/versions/{stored.version}").status_code == 200
        assert store.requests - before == {"ListObjectsV2": 2, "GetObject": 1}
        # a deploy through this node shows its version at once
        third = srv.deploy(write_function(tmp_path / "src3", "m", keep_alive_s=302)).version
        assert third in c.get("/v2/models/m").json()["versions"]
        assert c.get(f"/v2/models/m/versions/{stored.version}").status_code == 200  # kept
        # another node deletes m and deploys it again: what was kept of m goes once the
        # feed names it (a kept manifest outlived its version)
        other.delete_function("m")
        again = publish(other, write_function(tmp_path / "src4", "m", keep_alive_s=303))
        other.put_version(again)
        other.update_routing("m", lambda _: Routing({again.version: 100}))
        srv.call(node.registry.watch())
        assert c.get(f"/v2/models/m/versions/{stored.version}").status_code == 404
        assert c.get("/v2/models/m").json()["versions"] == [again.version]


# --- the function table alone: no server -----------------------------------------------


async def _table(tmp_path: Path) -> tuple[Registry, ManualClock, list[str]]:
    """A registry on a folder store (its schedulers in a thread, a manual clock) serving
    ``f`` with two stored versions, the second routed; the version ids."""
    repository = Repository(FileStore(tmp_path / "store"))
    loader = InstanceLoader(repository, tmp_path / "cache", detect_device("cpu"))
    clock = ManualClock()
    factory = SchedulerFactory(
        loader, clock, NoEvents(), Admission(100), isolation=IsolationMode.THREAD
    )
    registry = Registry(repository, factory, clock)
    versions = []
    for keep_alive_s in (300, 301):
        folder = write_function(tmp_path / f"src{keep_alive_s}", "f", keep_alive_s=keep_alive_s)
        _, vm = await asyncio.to_thread(
            store_version, repository, loader, publish(repository, folder)
        )
        await asyncio.to_thread(cut_over, repository, vm)
        versions.append(vm.version)
        if len(versions) == 1:
            await registry.entry("f")  # served here with the first version routed
    await registry.refresh(await registry.entry("f"))  # the second takes the traffic
    return registry, clock, versions


class _Hanging(FileStore):
    """A folder store whose reads of made-up functions' routing hang until ``opened``."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.opened = threading.Event()
        self.made_up_reads = 0
        self._counting = threading.Lock()  # reads run on the loop's threads

    def get(self, key: str) -> tuple[bytes, str]:
        if key.startswith("functions/made-up-"):
            with self._counting:
                self.made_up_reads += 1
            self.opened.wait(30)
        return super().get(key)


def test_a_flood_of_made_up_names_holds_up_no_stored_functions_first_call(
    tmp_path: Path,
) -> None:
    # Each request for a name nobody deployed read the store, a few at once, the rest
    # queued before the first calls of real functions: distinct made-up names from one
    # client could hold every first call up for as long as they kept coming. The
    # registry lists the store's functions at its start; a name outside them (and the
    # feed's) waits in a bounded lane of its own, and past it is refused unread (429).
    async def scenario() -> None:
        store = _Hanging(tmp_path / "store")
        repository = Repository(store)
        loader = InstanceLoader(repository, tmp_path / "cache", detect_device("cpu"))
        clock = ManualClock()
        factory = SchedulerFactory(
            loader, clock, NoEvents(), Admission(100), isolation=IsolationMode.THREAD
        )
        folder = write_function(tmp_path / "src", "f")
        _, vm = await asyncio.to_thread(
            store_version, repository, loader, publish(repository, folder)
        )
        await asyncio.to_thread(cut_over, repository, vm)
        registry = Registry(repository, factory, clock)
        await registry.start()  # f is listed, not served: its first call reads it
        try:
            flood = [
                asyncio.ensure_future(registry.entry(f"made-up-{i}", fresh=False))
                for i in range(UNLISTED_WAITING)
            ]
            for _ in range(500):  # the lane's reads on their threads, the rest waiting
                if store.made_up_reads == READS_AT_ONCE:
                    break
                await asyncio.sleep(0.01)
            with pytest.raises(Overloaded):  # the lane is full: 429, unread
                await asyncio.wait_for(registry.entry("made-up-x", fresh=False), 5)
            entry = await asyncio.wait_for(registry.entry("f", fresh=False), 5)
            assert entry.name == "f" and store.made_up_reads == READS_AT_ONCE
            store.opened.set()
            results = await asyncio.gather(*flood, return_exceptions=True)
            assert all(isinstance(r, FunctionNotFound) for r in results)
            assert store.made_up_reads == UNLISTED_WAITING  # each read once, none past it
        finally:
            store.opened.set()
            await registry.close()

    asyncio.run(scenario())


def test_a_version_past_its_rollback_window_is_retired_by_the_registry(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry, clock, (old, new) = await _table(tmp_path)
        entry = await registry.entry("f")
        assert set(entry.schedulers) == {old, new} and entry.left_at == {old: clock.now()}
        assert registry.rollbacks.names() == {"f"}  # what the sweep looks at, with the rest
        window = entry.primary.version.manifest.rollout.rollback_window_s
        assert rollback_over(entry.left_at, window, clock.now() + window - 1) == []
        assert rollback_over(entry.left_at, window, clock.now() + window) == [old]
        held = entry.schedulers[old]
        assert not registry.retire(entry, new)  # it has traffic: kept
        assert registry.retire(entry, old)
        assert set(entry.schedulers) == {new} and entry.left_at == {}
        assert registry.rollbacks.names() == set()
        await asyncio.sleep(0.01)
        assert held.batcher.closing  # closed in the background
        assert not registry.retire(entry, old)  # nothing held any more
        await registry.close()

    asyncio.run(scenario())


def test_hold_makes_a_scheduler_the_versions_and_closes_the_one_before(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry, _, (old, new) = await _table(tmp_path)
        entry = await registry.entry("f")
        before = entry.schedulers[new]
        candidate = registry.new_scheduler(before.version)
        registry.hold(entry, new, candidate)
        assert entry.schedulers[new] is candidate and entry.primary is candidate
        registry.hold(entry, new, candidate)  # already held: nothing closes
        registry.hold(entry, old, None)  # a candidate that failed its checks: dropped
        await asyncio.sleep(0.01)
        assert before.batcher.closing and not candidate.batcher.closing
        assert set(entry.schedulers) == {new}
        await registry.close()

    asyncio.run(scenario())
