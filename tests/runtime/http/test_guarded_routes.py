"""Every guard of ``Gateway.submit`` on every data route over HTTP: invoke, OIP infer,
split tails.

Each test sends the same request over the three routes of one split-capable
function (the cnn-split example) and checks that the guard acted on each: that
no route skips the gateway. The gateway alone, with no server, is
``tests/runtime/test_gateway.py``'s.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from fnrt.edge.activation import pack, read_outputs
from fnrt.runtime import scheduler as sched
from fnrt.runtime.gateway import Target
from fnrt.runtime.prewarm.keeper import Keeper
from fnrt.runtime.scheduler import Scheduler
from support import LiveServer, error_of, live_server, make_node

NAME = "cnn-split"
X = np.random.default_rng(5).random((1, 3, 32, 32), dtype=np.float32)
MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}


def _invoke(c: httpx.Client) -> httpx.Response:
    return c.post(f"/v1/functions/{NAME}/invoke", json={"x": X.tolist()})


def _infer(c: httpx.Client) -> httpx.Response:
    tensor = {"name": "x", "shape": list(X.shape), "datatype": "FP32", "data": X.ravel().tolist()}
    return c.post(f"/v2/models/{NAME}/infer", content=orjson.dumps({"inputs": [tensor]}))


def _split(c: httpx.Client) -> httpx.Response:
    return c.post(f"/v1/functions/{NAME}/split/0", content=pack(X), headers=MSGPACK)


ROUTES: dict[str, tuple[Callable[[httpx.Client], httpx.Response], Target]] = {
    "invoke": (_invoke, Target(NAME)),
    "infer": (_infer, Target(NAME)),
    "split": (_split, Target(NAME, split=0)),
}


def _y(route: str, r: httpx.Response) -> np.ndarray:
    if route == "split":
        return np.asarray(read_outputs(r.content)["y"])
    if route == "infer":
        return np.asarray(r.json()["outputs"][0]["data"])
    return np.asarray(r.json()["y"])


def _function(tmp_path: Path, cnn: Path, extra: str = "") -> Path:
    folder = tmp_path / "src" / NAME
    shutil.copytree(cnn, folder)
    (folder / "fnrt.toml").write_text((folder / "fnrt.toml").read_text() + extra)
    return folder


def _deploy(srv: LiveServer, folder: Path) -> str:
    return srv.deploy(folder).version


def _chosen(srv: LiveServer, target: Target) -> Scheduler:
    return srv.call(srv.node.gateway.choose(target))


@pytest.mark.parametrize("route", ROUTES)
def test_the_result_cache_answers_every_route(tmp_path: Path, cnn: Path, route: str) -> None:
    send, target = ROUTES[route]
    folder = _function(tmp_path, cnn, "\n[result_cache]\nenabled = true\n")
    with live_server(tmp_path) as srv, srv.client() as c:
        _deploy(srv, folder)
        first, second = send(c), send(c)
        assert first.status_code == second.status_code == 200, error_of(first)
        assert "x-fnrt-cache" not in first.headers
        assert second.headers["x-fnrt-cache"] == "hit"
        np.testing.assert_allclose(_y(route, first), _y(route, second))
        scheduler = _chosen(srv, target)
        assert scheduler.stats.totals.cache_hit.count == 1
        assert scheduler.stats.requests == 1  # the hit never reached the queue


@pytest.mark.parametrize("route", ROUTES)
def test_an_open_breaker_stops_every_route(tmp_path: Path, cnn: Path, route: str) -> None:
    send, target = ROUTES[route]
    folder = _function(tmp_path, cnn, "\n[breaker]\nmin_requests = 1\nopen_s = 60\n")
    with live_server(tmp_path) as srv, srv.client() as c:
        _deploy(srv, folder)
        assert send(c).status_code == 200
        scheduler = _chosen(srv, target)
        breaker = scheduler.protection.breaker
        for _ in range(3):  # three server-side failures: over the error rate
            breaker.record(srv.node.clock.now(), True)
        r = send(c)
        assert r.status_code == 503, error_of(r)
        assert "circuit breaker is open" in error_of(r)["error"]
        assert int(r.headers["retry-after"]) >= 1


@pytest.mark.parametrize("route", ROUTES)
def test_the_node_wide_admission_bound_holds_on_every_route(
    tmp_path: Path, cnn: Path, route: str
) -> None:
    send, _ = ROUTES[route]
    with live_server(tmp_path) as srv, srv.client() as c:
        _deploy(srv, cnn)
        srv.node.admission.max_queued = 0  # nothing may queue now
        r = send(c)
        assert r.status_code == 429, error_of(r)
        assert "the server has 0 requests queued" in error_of(r)["error"]
        srv.node.admission.max_queued = 10
        assert send(c).status_code == 200


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_counts_for_keep_alive(tmp_path: Path, cnn: Path, route: str) -> None:
    send, _ = ROUTES[route]
    keeper = Keeper(tmp_path / "history.json")
    node = make_node(tmp_path, keeper=keeper)
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        _deploy(srv, cnn)
        for _ in range(3):
            assert send(c).status_code == 200
        keeper.save()  # writes the minute so far too (its history takes it when it ends)
    assert Keeper(tmp_path / "history.json").histories[NAME].invocations == 3


@pytest.mark.parametrize("route", ROUTES)
def test_a_version_retired_under_a_request_hands_it_to_its_successor(
    tmp_path: Path, cnn: Path, route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    send, target = ROUTES[route]
    with live_server(tmp_path) as srv, srv.client() as c:
        _deploy(srv, cnn)
        assert send(c).status_code == 200
        stale = _chosen(srv, target)
        srv.call(sched.close(stale))  # it retired after this request chose it
        gateway = srv.node.gateway
        choose = gateway.choose
        calls: list[Scheduler] = []

        async def racing_choose(t: Target) -> Scheduler:
            if not calls:  # the first choice is the one made before the version retired
                calls.append(stale)
                return stale
            if t.split is None:  # the routing now holds a new scheduler of the version
                entry = await srv.node.registry.entry(NAME)
                if entry.schedulers[stale.version.version] is stale:
                    entry.schedulers[stale.version.version] = srv.node.registry.new_scheduler(
                        stale.version
                    )
            chosen = await choose(t)
            calls.append(chosen)
            return chosen

        monkeypatch.setattr(gateway, "choose", racing_choose)
        monkeypatch.setattr(gateway, "choose_now", lambda t: None)  # every choice races
        r = send(c)
        assert r.status_code == 200, error_of(r)
        assert len(calls) == 2 and calls[1] is not stale
        assert calls[1].stats.requests == 1


def test_counts_of_the_three_routes_add_up_on_their_schedulers(tmp_path: Path, cnn: Path) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        _deploy(srv, cnn)
        for send, _ in ROUTES.values():
            assert send(c).status_code == 200
        whole = _chosen(srv, Target(NAME))
        tail = _chosen(srv, Target(NAME, split=0))
        assert whole.stats.requests == 2 and tail.stats.requests == 1
