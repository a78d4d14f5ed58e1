"""Hot swap end to end: blue/green, canary, rollback, breaker, against a real server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from fnrt.functions.errors import DeployRejected, FnrtError
from fnrt.functions.routing import Routing
from fnrt.runtime import views
from fnrt.runtime.deployment import publish_version
from fnrt.runtime.gateway import Target
from fnrt.runtime.rollout import RolloutState
from support import (
    ECHO_MANIFEST,
    LiveServer,
    gate,
    live_server,
    make_node,
    publish,
    wait_until,
    write_function,
)

#: y = x + {add}: every response says by its value which version computed it.
ADDER = """
import fnrt_test_gates as gates

class Adder:
    def load(self, artifacts, device):
        if gates.gate("{name}-load-fails").is_set():
            raise RuntimeError("weights are corrupt")

    def __call__(self, batch):
        if gates.gate("{name}-fails").is_set():
            raise RuntimeError("out of memory")
        return [{"y": r["x"] + {add}} for r in batch]
"""

MANIFEST = """
name = "{name}"
handler = "handler:Adder"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 4] }}

[batching]
max_batch_size = 16

[rollout]
{rollout}

[breaker]
{breaker}
"""

X = [[1.0, 2.0, 3.0, 4.0]]


def adder(tmp: Path, name: str, add: int, rollout: str = "", breaker: str = "", files=None) -> Path:  # type: ignore[no-untyped-def]
    return write_function(
        tmp / f"{name}-{add}",
        name,
        ADDER.replace("{add}", str(add)).replace("{name}", name),
        MANIFEST,
        files=files,
        rollout=rollout,
        breaker=breaker,
    )


def deploy(srv: LiveServer, folder: Path, policy: str | None = None) -> str:
    return srv.deploy(folder, policy=policy).version


@dataclass(frozen=True)
class Call:
    started: float
    ended: float
    status: int
    version: str
    add: float  # y - x, which says what computed it


@contextmanager
def clients(srv: LiveServer, count: int, name: str) -> Iterator[list[Call]]:
    """``count`` clients invoking ``name`` in a loop until the block ends."""
    calls: list[Call] = []
    stop = threading.Event()

    def loop() -> None:
        with srv.client() as c:
            while not stop.is_set():
                started = time.monotonic()
                r = c.post(f"/v1/functions/{name}/invoke", json={"x": X})
                add = r.json()["y"][0][0] - X[0][0] if r.status_code == 200 else float("nan")
                calls.append(
                    Call(
                        started,
                        time.monotonic(),
                        r.status_code,
                        r.headers.get("x-fnrt-version", ""),
                        add,
                    )
                )

    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(loop) for _ in range(count)]
        try:
            wait_until(lambda: len(calls) >= count, 30)
            yield calls
        finally:
            stop.set()
            for f in futures:
                f.result()


def rollout_state(srv: LiveServer, name: str) -> str:
    status = (
        srv.call(views.versions(srv.registry, name, srv.node.deployer.rollouts))["rollout"] or {}
    )
    return str(status.get("state", ""))


CANARY = 'policy = "canary"\nsteps_percent = [10, 50, 100]\ndwell_s = 0.4\nmin_requests = 5'


def test_canary_cut_over_and_rollback_under_load_lose_no_request(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv:
        v1 = deploy(srv, adder(tmp_path, "model", 1, CANARY))
        with clients(srv, 32, "model") as calls:
            wait_until(lambda: len(calls) > 200, 30)
            v2 = deploy(srv, adder(tmp_path, "model", 2, CANARY))
            wait_until(lambda: rollout_state(srv, "model") == "done", 30)
            cut = time.monotonic()
            wait_until(lambda: sum(c.started > cut for c in calls) > 200, 30)
            rolling_back = time.monotonic()  # calls that end before this never see v1
            routing = srv.call(srv.node.deployer.rollback("model"))
            back = time.monotonic()  # calls that start after this never see v2
            assert routing.traffic == {v1: 100}
            wait_until(lambda: sum(c.started > back for c in calls) > 200, 30)
        done = list(calls)
    assert done and all(c.status == 200 for c in done), {c.status for c in done}
    assert {c.version for c in done} == {v1, v2}
    assert all(c.add == (1 if c.version == v1 else 2) for c in done)  # labels are true
    assert not [c for c in done if cut < c.started and c.ended < rolling_back and c.version == v1]
    assert not [c for c in done if c.started > back and c.version == v2]
    during = [c for c in done if c.ended < cut]
    assert any(c.version == v2 for c in during)  # the canary steps got traffic


def test_a_version_that_fails_its_probe_never_gets_traffic(tmp_path: Path) -> None:
    probe = json.dumps([{"inputs": {"x": X}, "outputs": {"y": [[2.0, 3.0, 4.0, 5.0]]}}])
    rollout = 'probe_file = "probe.json"\nwarmup_file = "probe.json"'
    files = {"probe.json": probe.encode()}
    with live_server(tmp_path) as srv, srv.client() as c:
        v1 = deploy(srv, adder(tmp_path, "model", 1, rollout, files=files))  # passes its probe
        with clients(srv, 4, "model") as calls:
            with pytest.raises(DeployRejected, match=r"probe failed: probe 0: output 'y' is off"):
                deploy(srv, adder(tmp_path, "model", 2, rollout, files=files))
            gate("model-load-fails").set()
            with pytest.raises(DeployRejected, match=r"failed to load: .*weights are corrupt"):
                deploy(srv, adder(tmp_path, "model", 3, rollout, files=files))
            gate("model-load-fails").clear()
            started = len(calls)
            wait_until(lambda: len(calls) > started + 50)
        assert {call.version for call in calls} == {v1}
        assert all(call.status == 200 for call in calls)
        routing, _ = srv.node.repository.get_routing("model")
        assert routing.traffic == {v1: 100} and routing.previous == ()
        # over HTTP the rejection is a 422 that says why
        vm = publish(srv.node.repository, adder(tmp_path, "model", 4, rollout, files=files))
        r = c.post("/v1/functions", json=vm.to_dict())
        assert r.status_code == 422
        assert r.json()["reason"].startswith("probe failed")
        assert c.post("/v1/functions/model/invoke", json={"x": X}).headers["x-fnrt-version"] == v1


def test_a_canary_that_errors_is_rolled_back_on_its_own(tmp_path: Path) -> None:
    canary = 'policy = "canary"\nsteps_percent = [50, 100]\ndwell_s = 30\nmin_requests = 10'
    with live_server(tmp_path) as srv:
        v1 = deploy(srv, adder(tmp_path, "model", 1, canary))
        bad = adder(tmp_path, "model", 2, canary)  # no probe: its errors show under traffic
        handler = bad / "handler.py"
        handler.write_text(
            handler.read_text().replace('gates.gate("model-fails").is_set()', "True")
        )
        with clients(srv, 8, "model") as calls:
            v2 = deploy(srv, bad)
            wait_until(lambda: rollout_state(srv, "model") == "rolled_back", 30)
            back = time.monotonic()
            wait_until(lambda: sum(c.started > back for c in calls) > 100, 30)
        status = srv.call(views.versions(srv.registry, "model", srv.node.deployer.rollouts))[
            "rollout"
        ]
        assert status["to"] == v2 and "error rate" in status["reason"]
        routing, _ = srv.node.repository.get_routing("model")
        assert routing.traffic == {v1: 100}
        assert v2 not in routing.previous  # a rollback never goes to the failed canary
        after = [c for c in calls if c.started > back]
        assert all(c.status == 200 and c.version == v1 for c in after)
        assert any(c.status != 200 for c in calls)  # the canary's errors were seen


def test_concurrent_deploys_on_two_nodes_leave_valid_routing(tmp_path: Path) -> None:
    folders = [adder(tmp_path, "model", add) for add in range(1, 9)]
    with (
        live_server(tmp_path) as a,
        live_server(tmp_path, node=make_node(tmp_path)) as b,
    ):
        ids = [deploy(a, folders[0])]

        def one(i: int) -> str:
            return deploy((a, b)[i % 2], folders[i])

        with ThreadPoolExecutor(7) as pool:
            ids += list(pool.map(one, range(1, 8)))
        data, _ = a.node.repository.store.get("functions/model/routing.json")
        routing = Routing.from_json(data)  # parses: never a torn or lost write
        assert len(routing.traffic) == 1 and routing.primary in ids
        assert set(ids) == {routing.primary, *routing.previous}
        # each node serves what the store says (the other one notices by polling)
        for srv in (a, b):
            with srv.client() as c:
                wait_until(
                    lambda c=c: (
                        c.post("/v1/functions/model/invoke", json={"x": X}).headers[
                            "x-fnrt-version"
                        ]
                        == routing.primary
                    ),
                    10,
                )


BREAKER = "min_requests = 4\nopen_s = 0.3\nhalf_open_probes = 3\nfallback = '{fallback}'"


def test_the_breaker_opens_serves_the_fallback_function_and_closes(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        backup = deploy(srv, adder(tmp_path, "backup", 100))
        flaky = deploy(
            srv, adder(tmp_path, "flaky", 1, breaker=BREAKER.format(fallback="function:backup"))
        )

        def invoke(x: list[list[float]] = X) -> httpx.Response:
            return c.post("/v1/functions/flaky/invoke", json={"x": x})

        assert invoke().json()["y"] == [[2, 3, 4, 5]]
        gate("flaky-fails").set()
        statuses = [invoke().status_code for _ in range(3)]
        assert statuses == [500, 500, 500]  # 3 of 4 failed: the breaker opens
        r = invoke()
        assert r.status_code == 200 and r.json()["y"] == [[101, 102, 103, 104]]
        assert r.headers["x-fnrt-fallback"] == "function:backup"
        assert r.headers["x-fnrt-function"] == "backup"
        assert r.headers["x-fnrt-version"] == backup
        versions = c.get("/v1/functions/flaky/versions").json()
        assert versions["versions"][0]["breaker"] == "open"
        # the failed requests were kept, inputs and all
        kept = c.get("/v1/functions/flaky/failures").json()["failures"]
        assert len(kept) == 3 and kept[0]["inputs"] == {"x": X} and kept[0]["version"] == flaky
        assert "out of memory" in kept[0]["error"]["error"]
        gate("flaky-fails").clear()
        time.sleep(0.35)  # open_s passes: the next requests are probes
        probes = [invoke() for _ in range(3)]
        assert all(p.status_code == 200 and "x-fnrt-fallback" not in p.headers for p in probes)
        assert c.get("/v1/functions/flaky/versions").json()["versions"][0]["breaker"] == "closed"
        assert invoke().headers["x-fnrt-version"] == flaky


def test_the_cache_fallback_answers_known_inputs_and_503s_the_rest(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        deploy(srv, adder(tmp_path, "flaky", 1, breaker=BREAKER.format(fallback="cache")))
        known = [[0.0, 0.0, 0.0, 1.0]]
        assert c.post("/v1/functions/flaky/invoke", json={"x": known}).status_code == 200
        gate("flaky-fails").set()
        for _ in range(3):  # with the success before: 3 of 4 failed, and it opens
            assert c.post("/v1/functions/flaky/invoke", json={"x": X}).status_code == 500
        r = c.post("/v1/functions/flaky/invoke", json={"x": known})
        assert r.status_code == 200 and r.json()["y"] == [[1, 1, 1, 2]]
        assert r.headers["x-fnrt-fallback"] == "cache"
        started = time.monotonic()
        r = c.post("/v1/functions/flaky/invoke", json={"x": X})
        assert time.monotonic() - started < 1.0  # fast, never a hang
        assert r.status_code == 503 and "circuit breaker is open" in r.json()["error"]
        assert int(r.headers["retry-after"]) >= 1


def test_traffic_versions_and_rollback_routes(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        v1 = deploy(srv, adder(tmp_path, "model", 1))
        r = c.post("/v1/functions/model/rollback")
        assert r.status_code == 409 and "no earlier version" in r.json()["error"]
        v2 = deploy(srv, adder(tmp_path, "model", 2))
        r = c.put("/v1/functions/model/traffic", json={"traffic": {v1: 70, v2: 30}})
        assert r.status_code == 200 and r.json()["traffic"] == {v1: 70, v2: 30}
        seen = {
            c.post("/v1/functions/model/invoke", json={"x": X}).headers["x-fnrt-version"]
            for _ in range(60)
        }
        assert seen == {v1, v2}
        listing = c.get("/v1/functions/model/versions").json()
        assert {v["version"]: v["share"] for v in listing["versions"]} == {v1: 70, v2: 30}
        for bad in (
            {"traffic": {v1: 60, v2: 30}},
            {"traffic": {v1: 100.0}},
            {"traffic": []},
            [1],
        ):
            assert c.put("/v1/functions/model/traffic", json=bad).status_code == 400
        r = c.put("/v1/functions/model/traffic", json={"traffic": {"v-000000000000": 100}})
        assert r.status_code == 404
        assert c.put("/v1/functions/nope/traffic", json={"traffic": {v1: 100}}).status_code == 404
        r = c.post("/v1/functions/model/rollback")  # back to the version before the split
        assert r.status_code == 200
        routing, _ = srv.node.repository.get_routing("model")
        assert len(routing.traffic) == 1 and routing.primary in (v1, v2)
        assert c.post("/v1/functions?policy=sideways", json={}).status_code == 400


def test_after_a_rollback_the_listing_no_longer_says_done(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        v1 = deploy(srv, adder(tmp_path, "model", 1))
        v2 = deploy(srv, adder(tmp_path, "model", 2))
        rollout = c.get("/v1/functions/model/versions").json()["rollout"]
        assert (rollout["policy"], rollout["to"], rollout["state"]) == ("immediate", v2, "done")
        assert c.post("/v1/functions/model/rollback").status_code == 200
        for path in ("/v1/functions/model/versions", "/v1/functions/model"):
            rollout = c.get(path).json()["rollout"]
            assert (rollout["to"], rollout["state"]) == (v2, "rolled_back"), rollout
            assert rollout["reason"] == f"rolled back by hand to {v1}"
        v3 = deploy(srv, adder(tmp_path, "model", 3))
        srv.call(srv.node.deployer.set_traffic("model", {v1: 100}))  # moved off by hand
        rollout = c.get("/v1/functions/model/versions").json()["rollout"]
        assert (rollout["to"], rollout["state"]) == (v3, "superseded"), rollout
        assert rollout["reason"] == f"traffic has moved off it since: {v1} 100%"


def test_sticky_header_keeps_a_user_on_one_version(tmp_path: Path) -> None:
    sticky = 'sticky_header = "x-user"'
    with live_server(tmp_path) as srv, srv.client() as c:
        v1 = deploy(srv, adder(tmp_path, "model", 1, sticky))
        v2 = deploy(srv, adder(tmp_path, "model", 2, sticky))
        srv.call(srv.node.deployer.set_traffic("model", {v1: 50, v2: 50}))
        for user in ("ann", "bob", "cy", "dee"):
            versions = {
                c.post(
                    "/v1/functions/model/invoke", json={"x": X}, headers={"x-user": user}
                ).headers["x-fnrt-version"]
                for _ in range(10)
            }
            assert len(versions) == 1


#: y = x * {k}: which version answered, by its value (no gates: in worker threads here)
TIMES = """
class Echo:
    def load(self, artifacts, device):
        pass

    def __call__(self, batch):
        return [{{"y": r["x"] * {k}}} for r in batch]
"""

#: A version whose every batch passes its 0.1 s timeout: each instance dies in turn
DYING = """
import time

class Echo:
    def load(self, artifacts, device):
        pass

    def __call__(self, batch):
        time.sleep(0.3)
        return [{"y": r["x"]} for r in batch]
"""


def _canary(steps: str, dwell_s: float, extra: str = "") -> str:
    return (
        ECHO_MANIFEST
        + f'\n[rollout]\npolicy = "canary"\nsteps_percent = {steps}\ndwell_s = {dwell_s}\n'
        + extra
    )


def test_a_canary_whose_instances_keep_dying_is_rolled_back_not_promoted(
    tmp_path: Path,
) -> None:
    """Its breaker opens after three deaths in a row: the requests it then refuses never
    reach its outcomes, so its error rate was never judged and it walked to 100%."""
    dying = _canary("[20, 100]", 4, '\n[isolation]\nmode = "thread"\ntimeout_s = 0.1\n')

    async def scenario() -> None:
        node = make_node(tmp_path, isolation="thread")
        try:
            v1 = await node.deployer.deploy(
                publish(node.repository, write_function(tmp_path / "v1", "f"))
            )
            stop = asyncio.Event()
            gateway = node.gateway

            async def client() -> None:
                x = np.ones((1, 4), np.float32)
                while not stop.is_set():
                    target = Target("f")
                    scheduler = gateway.choose_now(target) or await gateway.choose(target)
                    with contextlib.suppress(FnrtError):
                        await gateway.submit(gateway.call(scheduler, {"x": x}))
                    await asyncio.sleep(0.01)

            clients = [asyncio.ensure_future(client()) for _ in range(6)]
            folder = write_function(tmp_path / "v2", "f", DYING, manifest=dying)
            assert (await node.deployer.deploy(publish(node.repository, folder))).rollout
            canary = node.deployer.rollouts.of("f").canary
            assert canary is not None and canary.task is not None
            await asyncio.wait_for(canary.task, 15)
            stop.set()
            await asyncio.gather(*clients, return_exceptions=True)
            assert canary.status.state is RolloutState.ROLLED_BACK, canary.status.to_dict()
            assert "circuit breaker" in (canary.status.reason or "")
            assert node.repository.get_routing("f")[0].traffic == {v1.version: 100}
        finally:
            await node.close(timeout_s=1.0)

    asyncio.run(scenario())


def test_a_canary_never_writes_over_a_routing_changed_elsewhere(tmp_path: Path) -> None:
    """Another node (or ``fnrt deploy --store``) cuts over to v3 during this node's
    canary of v2: the canary stops, and v3 keeps all traffic."""

    async def scenario() -> None:
        node = make_node(tmp_path, isolation="thread")
        try:
            await node.deployer.deploy(
                publish(node.repository, write_function(tmp_path / "v1", "f"))
            )
            folder = write_function(
                tmp_path / "v2", "f", TIMES.format(k=3), manifest=_canary("[10, 50, 100]", 0.5)
            )
            assert (await node.deployer.deploy(publish(node.repository, folder))).rollout
            vm3 = publish(node.repository, write_function(tmp_path / "v3", "f", TIMES.format(k=4)))
            v3 = await asyncio.to_thread(publish_version, node.repository, node.loader, vm3)
            canary = node.deployer.rollouts.of("f").canary
            assert canary is not None and canary.task is not None
            await asyncio.wait_for(canary.task, 10)
            assert canary.status.state is RolloutState.STOPPED
            assert node.repository.get_routing("f")[0].traffic == {v3.version: 100}
        finally:
            await node.close(timeout_s=1.0)

    asyncio.run(scenario())


def test_a_rollback_during_a_canary_step_being_written_is_the_last_word(
    tmp_path: Path,
) -> None:
    """The canary's next split is on its way to a slow store when a rollback cancels
    the canary: the rollback waits for it, and its own write comes last."""

    async def scenario() -> None:
        node = make_node(tmp_path, isolation="thread")
        store, put = node.repository.store, node.repository.store.put
        slow = threading.Event()

        def slow_put(key: str, data: bytes, **kwargs: Any) -> str:
            if key.endswith("routing.json") and slow.is_set() and b": 50" in data:
                time.sleep(0.5)  # the canary's 50% step, on a slow store
            return put(key, data, **kwargs)

        store.put = slow_put  # type: ignore[method-assign]
        try:
            v1 = await node.deployer.deploy(
                publish(node.repository, write_function(tmp_path / "v1", "f"))
            )
            folder = write_function(
                tmp_path / "v2", "f", TIMES.format(k=2), manifest=_canary("[10, 50, 100]", 0.5)
            )
            await node.deployer.deploy(publish(node.repository, folder))
            slow.set()
            await asyncio.sleep(0.6)  # the 50% write is under way now
            routing = await node.deployer.rollback("f")
            await asyncio.sleep(1.0)
            assert dict(routing.traffic) == {v1.version: 100}
            assert node.repository.get_routing("f")[0].traffic == {v1.version: 100}
        finally:
            store.put = put  # type: ignore[method-assign]
            await node.close(timeout_s=1.0)

    asyncio.run(scenario())


def test_a_rollback_through_another_node_during_a_canary_returns_to_its_start(
    tmp_path: Path,
) -> None:
    """The node that runs the canary is not the one asked to roll back (the shipped
    nginx routes a deploy and a rollback by different keys): back to where the split
    began, not to the version before it, and the canary stops there."""

    async def scenario() -> None:
        a, b = make_node(tmp_path, isolation="thread"), make_node(tmp_path, isolation="thread")
        try:
            for k in (1, 2):
                folder = write_function(tmp_path / f"v{k}", "f", TIMES.format(k=k))
                started = await a.deployer.deploy(publish(a.repository, folder))
            folder = write_function(
                tmp_path / "v3", "f", TIMES.format(k=3), manifest=_canary("[10, 50, 100]", 1.5)
            )
            assert (await a.deployer.deploy(publish(a.repository, folder))).rollout
            routing = await b.deployer.rollback("f")
            assert dict(routing.traffic) == {started.version: 100}
            await asyncio.sleep(2.0)  # the canary's next step finds it changed: it stops
            assert a.repository.get_routing("f")[0].traffic == {started.version: 100}
        finally:
            await a.close(timeout_s=1.0)
            await b.close(timeout_s=1.0)

    asyncio.run(scenario())


def test_a_deploy_during_a_canary_starts_from_the_version_the_canary_began_from(
    tmp_path: Path,
) -> None:
    """v2's canary is at 50% (where v2 is the primary: the newer wins a tie) when v3 is
    deployed: v3's canary starts from v1, the version proven, and v2 leaves."""

    async def scenario() -> None:
        node = make_node(tmp_path, isolation="thread")
        try:
            v1 = await node.deployer.deploy(
                publish(node.repository, write_function(tmp_path / "v1", "f"))
            )
            half = _canary("[50, 100]", 30)
            folder = write_function(tmp_path / "v2", "f", TIMES.format(k=2), manifest=half)
            v2 = await node.deployer.deploy(publish(node.repository, folder))
            assert node.repository.get_routing("f")[0].traffic == {v1.version: 50, v2.version: 50}
            slow = _canary("[10, 100]", 30)
            folder = write_function(tmp_path / "v3", "f", TIMES.format(k=3), manifest=slow)
            v3 = await node.deployer.deploy(publish(node.repository, folder))
            routing = node.repository.get_routing("f")[0]
            assert routing.traffic == {v1.version: 90, v3.version: 10}
            assert routing.source == v1.version
            assert node.deployer.rollouts.of("f").canary.status.source == v1.version  # type: ignore[union-attr]
        finally:
            await node.close(timeout_s=1.0)

    asyncio.run(scenario())
