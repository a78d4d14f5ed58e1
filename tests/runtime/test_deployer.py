"""A deploy readies what its version's first call needs before it answers (#45)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fnrt.loader.device import detect_device
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.repository import Repository
from fnrt.loader.spares import SpareWorkers
from fnrt.loader.stores import FileStore
from fnrt.runtime.deployer import Deployer
from support import (
    ISOLATED_MANIFEST,
    LiveServer,
    assert_stages_add_up,
    live_server,
    make_node,
    publish,
    write_function,
)

#: ``idna`` is installed with fnrt (httpx needs it) and a worker never imports it itself:
#: a spare ready for this code has imported it.
HANDLER = """
import idna
import numpy as np

class H:
    def __call__(self, batch):
        return [{"y": np.asarray(r["x"], dtype=np.float32)} for r in batch]
"""
X = {"x": [[1.0, 2.0, 3.0, 4.0]]}


@pytest.fixture
def spares() -> Iterator[SpareWorkers]:
    pool = SpareWorkers(1)  # the node's default: one, refilled a second after a cold start
    yield pool
    pool.close()


def _server(tmp_path: Path, spares: SpareWorkers) -> Iterator[LiveServer]:
    loader = InstanceLoader(
        Repository(FileStore(tmp_path / "store")), tmp_path / "cache", detect_device("cpu")
    )
    loader.spares = spares
    with live_server(tmp_path, node=make_node(tmp_path, loader=loader)) as srv:
        yield srv


def _deploy(
    srv: LiveServer,
    tmp_path: Path,
    name: str,
    *,
    mode: str = "process",
    manifest: str = ISOLATED_MANIFEST,
    files: dict[str, bytes] | None = None,
    deployer: Deployer | None = None,
) -> dict[str, object]:
    """Deploy ``name`` (``HANDLER`` in ``mode``) with ``deployer``, by default the
    node's; what its readying checked."""
    values = {"mode": mode, "timeout_s": 0, "memory_limit_bytes": 0}
    folder = write_function(tmp_path / "src", name, HANDLER, manifest, files, **values)
    deployer = deployer or srv.node.deployer
    deployed = srv.call(deployer.deploy(publish(srv.node.repository, folder)), 60)
    return deployed.checks["ready"]  # type: ignore[no-any-return]


def _deployed_unready_then_served(
    srv: LiveServer, tmp_path: Path, deployer: Deployer | None = None
) -> None:
    """A deploy whose worker was not readied stands: it answers, and its first call
    starts a worker."""
    assert _deploy(srv, tmp_path, "late", deployer=deployer)["worker"] == "not ready"
    with srv.client() as c:
        assert c.post("/v1/functions/late/invoke", json=X).status_code == 200


def _first_call_takes_a_spare(c: httpx.Client, name: str, spares: SpareWorkers, taken: int) -> None:
    """``name``'s first call is a cold start on a warmed spare, the ``taken``-th: no
    Python was started for it (short worker and setup stages), and its stages add up."""
    r = c.post(f"/v1/functions/{name}/invoke", json=X)
    assert r.status_code == 200 and r.headers["x-fnrt-cold-start"]
    assert spares.taken == taken
    timings = c.get(f"/v1/functions/{name}").json()["instance"]["last_load_timings_s"]
    assert timings["worker_s"] < 0.1 and timings["setup_s"] < 0.25, timings
    assert_stages_add_up(timings)


def test_each_of_deploys_one_right_after_another_finds_a_warmed_worker(
    tmp_path: Path, spares: SpareWorkers
) -> None:
    for srv in _server(tmp_path, spares):
        with srv.client() as c:
            for i, name in enumerate(["f1", "f2", "f3", "f4"]):
                ready = _deploy(srv, tmp_path, name)
                assert ready["worker"] == "ready" and ready["files"] == "ready", ready
                # called at once, it takes a spare, warm: before, from the second on, the
                # spare taken by the call before was replaced only a second after its
                # load, so this call started a Python of its own (its interpreter and
                # imports in setup_s)
                _first_call_takes_a_spare(c, name, spares, i + 1)


def test_deploys_one_right_after_another_then_their_first_calls_each_find_a_warmed_worker(
    tmp_path: Path, spares: SpareWorkers
) -> None:
    names = ["g1", "g2", "g3"]
    for srv in _server(tmp_path, spares):
        for name in names:  # each answers with one spare more: one per deploy not yet called
            assert _deploy(srv, tmp_path, name)["worker"] == "ready"
        assert spares.ready == len(names)
        with srv.client() as c:
            for i, name in enumerate(names):
                # before, one spare was kept whatever came: the second call started a
                # Python of its own
                _first_call_takes_a_spare(c, name, spares, i + 1)


def test_deploys_that_load_their_version_keep_no_spare_ahead(
    tmp_path: Path, spares: SpareWorkers
) -> None:
    warmed = ISOLATED_MANIFEST + '\n[rollout]\nwarmup_file = "sample.json"\n'
    files = {"sample.json": json.dumps(X).encode()}
    for srv in _server(tmp_path, spares):
        for name in ["w1", "w2", "w3"]:
            assert _deploy(srv, tmp_path, name, manifest=warmed, files=files)["worker"] == "ready"
            # loaded by its warm-up: its first call is warm, so no spare is kept for it
            assert spares.ready == 1 and not spares._ahead


def test_a_deploy_whose_worker_is_not_ready_in_time_still_succeeds(
    tmp_path: Path, spares: SpareWorkers
) -> None:
    for srv in _server(tmp_path, spares):
        node = srv.node
        hasty = Deployer(node.registry, node.splits, node.loader, node.clock, ready_timeout_s=0)
        _deployed_unready_then_served(srv, tmp_path, hasty)  # it did not wait


def test_a_deploy_whose_worker_cannot_be_readied_still_succeeds(
    tmp_path: Path, spares: SpareWorkers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readying that fails (here the wait on a spare's pipe raises, as ``select`` did
    past descriptor 1023) leaves the deploy standing: its first call starts a worker."""

    def broken(*args: object, **kwargs: object) -> bool:
        raise ValueError("filedescriptor out of range in select()")

    monkeypatch.setattr(spares, "ready_for", broken)
    for srv in _server(tmp_path, spares):
        _deployed_unready_then_served(srv, tmp_path)


def test_a_thread_function_needs_no_worker(tmp_path: Path, spares: SpareWorkers) -> None:
    for srv in _server(tmp_path, spares):
        assert _deploy(srv, tmp_path, "t", mode="thread")["worker"] == "none"
