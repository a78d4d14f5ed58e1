"""A cold start's recorded stages add up to its total, its first batch included."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fnrt.functions.manifest import IsolationMode
from fnrt.loader.device import detect_device
from fnrt.loader.instance import STAGES, InstanceLoader
from fnrt.loader.launch import launch
from fnrt.loader.process import ProcessInstance
from fnrt.loader.repository import Repository
from fnrt.loader.stores import FileStore
from support import (
    ISOLATED_MANIFEST,
    MISBEHAVING_HANDLER,
    assert_stages_add_up,
    live_server,
    publish,
    traced_server,
    wait_until,
    write_function,
)

#: A handler whose first batch does a lazy set-up (as torch's first forward does): the
#: stage of a cold start that its load does not see.
LAZY_HANDLER = """
import time

import numpy as np


class H:
    def __init__(self):
        self.ready = False

    def __call__(self, batch):
        if not self.ready:
            time.sleep(0.3)
            self.ready = True
        return [{"y": np.asarray(r["x"], dtype=np.float32)} for r in batch]
"""


def test_the_stages_of_a_process_cold_start_add_up_to_its_total(tmp_path: Path) -> None:
    repository = Repository(FileStore(tmp_path / "store"))
    values = {"mode": "process", "timeout_s": 0, "memory_limit_bytes": 0}
    folder = write_function(tmp_path / "src", "w", MISBEHAVING_HANDLER, ISOLATED_MANIFEST, **values)
    vm = publish(repository, folder)
    loader = InstanceLoader(repository, tmp_path / "cache", detect_device("cpu"))
    instance = launch(loader, IsolationMode.PROCESS, vm, ThreadPoolExecutor(1))  # type: ignore[arg-type]
    try:
        assert isinstance(instance, ProcessInstance)
        timings = instance.timings_s
        loaded = [s for s in STAGES if s != "first_batch_s"]  # no batch has run yet
        assert set(loaded) <= set(timings) and all(timings[s] >= 0 for s in loaded)
        assert timings["worker_s"] > 0 and timings["files_s"] >= timings["fetch_s"]
        # before, import_s + load_s + fetch_s + verify_s was all there was: the worker's
        # start and the load message's round trip were in no stage
        assert_stages_add_up(timings)
    finally:
        instance.close()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_cold_starts_first_batch_is_a_stage_and_the_stages_add_up(
    tmp_path: Path, mode: str
) -> None:
    values = {"mode": mode, "timeout_s": 0, "memory_limit_bytes": 0}
    write_function(tmp_path / "src", "lazy", LAZY_HANDLER, ISOLATED_MANIFEST, **values)
    with live_server(tmp_path) as srv, srv.client() as c:
        vm = publish(srv.node.repository, tmp_path / "src" / "lazy")
        srv.call(srv.node.deployer.deploy(vm))
        r = c.post("/v1/functions/lazy/invoke", json={"x": [[1.0, 2.0, 3.0, 4.0]]})
        assert r.status_code == 200 and r.headers["x-fnrt-cold-start"]
        timings = c.get("/v1/functions/lazy").json()["instance"]["last_load_timings_s"]
        # before, the first batch was in no stage: the 0.3 s of lazy set-up of this
        # handler (torch's first forward, say) left the total short of the first call.
        # (A worker starts its first batch as its load returns, sent right behind the
        # load message; the stage counts from when the server has the instance, a few
        # milliseconds on, where the load's stages end.)
        assert timings["first_batch_s"] >= (0.25 if mode == "process" else 0.3)
        assert_stages_add_up(timings)
        metrics = c.get("/metrics").text
        assert 'fnrt_load_stage_duration_seconds_count{stage="first_batch"} 1.0' in metrics
        r = c.post("/v1/functions/lazy/invoke", json={"x": [[1.0, 2.0, 3.0, 4.0]]})
        again = c.get("/v1/functions/lazy").json()["instance"]["last_load_timings_s"]
        assert again == timings  # a warm batch is no stage of it


def test_the_load_span_shows_the_first_batch(tmp_path: Path) -> None:
    values = {"mode": "thread", "timeout_s": 0, "memory_limit_bytes": 0}
    folder = write_function(tmp_path / "src", "lazy", LAZY_HANDLER, ISOLATED_MANIFEST, **values)
    with traced_server(tmp_path) as (srv, exporter), srv.client() as c:
        srv.deploy(folder)
        assert c.post("/v1/functions/lazy/invoke", json={"x": [[1.0] * 4]}).status_code == 200
        wait_until(lambda: any(s.name == "load" for s in list(exporter.spans)))
        (load,) = [s for s in list(exporter.spans) if s.name == "load"]
        assert load.attributes["fnrt.load.first_batch_s"] >= 0.3
        stages = {k.removeprefix("fnrt.load."): v for k, v in load.attributes.items()}
        assert_stages_add_up({k: v for k, v in stages.items() if k.endswith("_s")})
