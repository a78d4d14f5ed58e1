"""L3 -> L2 -> L1 end to end over a real S3 endpoint, faults, and the L1 memory budget."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from s3support import FaultProxy, MotoEndpoint

from fnrt.runtime.cli.main import main
from fnrt.runtime.clock import ManualClock
from fnrt.runtime.node import Node
from support import (
    WEIGHTED_HANDLER,
    WEIGHTED_MANIFEST,
    LiveServer,
    assert_stages_add_up,
    gates,
    live_server,
    s3_registry,
    write_function,
)

X = {"x": [[1.0, 2.0, 3.0, 4.0]]}


def deploy_to_s3(tmp: Path, s3: MotoEndpoint, name: str, size: int) -> None:
    weights = bytes([7]) + os.urandom(size - 1)
    folder = write_function(
        tmp / "src", name, WEIGHTED_HANDLER, WEIGHTED_MANIFEST, files={"w.bin": weights}
    )
    argv = ["deploy", str(folder), "--store", "s3://fnrt/fns", "--s3-endpoint", s3.url, "-q"]
    assert main(argv) == 0


def evictions(node: Node) -> float | None:
    """``fnrt_evictions_total{reason="budget"}`` (None: none counted yet)."""
    registry = node.telemetry.metrics.registry
    return registry.get_sample_value("fnrt_evictions_total", {"reason": "budget"})


def invoke(srv: LiveServer, name: str) -> tuple[int, str | None]:
    with srv.client() as c:
        r = c.post(f"/v1/functions/{name}/invoke", json=X)
    return r.status_code, r.headers.get("x-fnrt-cold-start")


def test_l3_then_l2_then_l1(
    tmp_path: Path, s3: MotoEndpoint, proxy: FaultProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    deploy_to_s3(tmp_path, s3, "weighted", 6 * 2**20)
    capsys.readouterr()
    clock = ManualClock()
    node = s3_registry(tmp_path / "node", proxy.url, clock)
    with live_server(tmp_path / "node", node=node) as srv:
        assert invoke(srv, "weighted") == (200, "l3")  # empty cache: fetched from the store
        assert invoke(srv, "weighted") == (200, None)  # warm: L1
        clock.advance(301)
        assert srv.call(node.sweeper.sweep()) == ["weighted"]
        gets = proxy.gets(b"/blobs/sha256/")
        assert invoke(srv, "weighted") == (200, "l2")  # scaled to zero: mapped from disk
        assert proxy.gets(b"/blobs/sha256/") == gets  # nothing downloaded again
        with srv.client() as c:
            instance = c.get("/v1/functions/weighted").json()["instance"]
        assert instance["cold_starts"] == {"l3": 1, "l2": 1}
        assert instance["last_load_tier"] == "l2"
        assert set(instance["last_load_timings_s"]) == {
            "files_s",
            "fetch_s",
            "verify_s",
            "room_s",
            "import_s",
            "load_s",
            "after_s",
            "first_batch_s",
            "total_s",
        }
        assert_stages_add_up(instance["last_load_timings_s"])


def test_store_down_503_for_what_is_not_cached_while_l2_keeps_serving(
    tmp_path: Path, s3: MotoEndpoint, proxy: FaultProxy
) -> None:
    deploy_to_s3(tmp_path, s3, "cached", 1000)
    deploy_to_s3(tmp_path, s3, "remote", 1000)
    clock = ManualClock()
    node = s3_registry(tmp_path / "node", proxy.url, clock)
    with live_server(tmp_path / "node", node=node) as srv:
        assert invoke(srv, "cached") == (200, "l3")
        srv.call(node.registry.get("remote"))  # known to this node, never loaded
        clock.advance(301)
        assert srv.call(node.sweeper.sweep()) == ["cached"]
        proxy.set("refuse")  # the store goes away
        with srv.client() as c:
            r = c.post("/v1/functions/remote/invoke", json=X)
            assert r.status_code == 503
            assert "failed after retries" in r.json()["error"]
            assert "s3://fnrt/fns/blobs/sha256/" in r.json()["error"]
        assert invoke(srv, "cached") == (200, "l2")
        proxy.set("pass")
        assert invoke(srv, "remote") == (200, "l3")  # and it recovers


def test_a_load_whose_store_is_down_evicts_nothing_for_its_room(
    tmp_path: Path, s3: MotoEndpoint, proxy: FaultProxy
) -> None:
    deploy_to_s3(tmp_path, s3, "warm", 400_000)
    deploy_to_s3(tmp_path, s3, "remote", 600_000)
    node = s3_registry(tmp_path / "node", proxy.url, ManualClock(), memory_budget_bytes=900_000)
    with live_server(tmp_path / "node", node=node) as srv:
        assert invoke(srv, "warm") == (200, "l3")
        srv.call(node.registry.get("remote"))  # known to this node, never loaded
        proxy.set("refuse")  # the store goes away
        assert invoke(srv, "remote")[0] == 503  # its files could not be fetched...
        # ...so no room was made for it: "warm" (400 + 600 kB > 900 kB) stays loaded
        assert {s.name: s.pool.state.value for s in node.schedulers()} == {
            "warm": "warm",
            "remote": "cold",
        }
        assert evictions(node) is None  # none counted
        assert invoke(srv, "warm") == (200, None)
        proxy.set("pass")
        assert invoke(srv, "remote") == (200, "l3")  # once it is back: now "warm" goes
        assert evictions(node) == 1.0


def test_memory_budget_evicts_the_least_recently_used_idle_instance(
    tmp_path: Path, s3: MotoEndpoint
) -> None:
    for name in ("a", "b", "c"):
        deploy_to_s3(tmp_path, s3, name, 400_000)
    node = s3_registry(tmp_path / "node", s3.url, ManualClock(), memory_budget_bytes=900_000)
    with live_server(tmp_path / "node", node=node) as srv:
        assert invoke(srv, "a")[0] == 200
        assert invoke(srv, "b")[0] == 200
        states = lambda: {s.name: s.pool.state.value for s in node.schedulers()}  # noqa: E731
        assert states() == {"a": "warm", "b": "warm"}  # "c" is not held until called
        assert invoke(srv, "c")[0] == 200  # 3 x 400 kB > 900 kB: "a" goes
        assert states() == {"a": "cold", "b": "warm", "c": "warm"}
        assert invoke(srv, "a") == (200, "l2")  # its file stayed on disk: a map, not a download
        assert states() == {"a": "warm", "b": "cold", "c": "warm"}
        assert len(gates.loads) == 4


def test_deploy_to_s3_uploads_only_missing_blobs(
    tmp_path: Path, s3: MotoEndpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_function(
        tmp_path / "src",
        "f",
        WEIGHTED_HANDLER,
        WEIGHTED_MANIFEST,
        files={"w.bin": os.urandom(1000)},
    )
    argv = ["deploy", str(folder), "--store", "s3://fnrt/fns", "--s3-endpoint", s3.url, "--json"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    second = capsys.readouterr().out
    import json

    assert json.loads(first)["uploaded_blobs"] == 2
    assert json.loads(second)["uploaded_blobs"] == 0 and json.loads(second)["created"] is False
