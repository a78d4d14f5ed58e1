"""A cold start in a worker process: its recorded stages add up to its total."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fnrt.functions.manifest import IsolationMode
from fnrt.loader.device import detect_device
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.process import ProcessInstance, launch
from fnrt.loader.repository import Repository
from fnrt.loader.stores import FileStore
from support import ISOLATED_MANIFEST, MISBEHAVING_HANDLER, publish, write_function

#: the stages of a cold start in a worker; fetch_s and verify_s are parts of files_s
STAGES = ("environment_s", "files_s", "worker_s", "import_s", "load_s", "setup_s", "after_s")


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
        assert set(STAGES) <= set(timings) and all(timings[s] >= 0 for s in STAGES)
        assert timings["worker_s"] > 0 and timings["files_s"] >= timings["fetch_s"]
        # before, import_s + load_s + fetch_s + verify_s was all there was: the worker's
        # start and the load message's round trip were in no stage
        assert sum(timings[s] for s in STAGES) >= 0.95 * timings["total_s"]
        assert sum(timings[s] for s in STAGES) <= timings["total_s"] * 1.0001
    finally:
        instance.close()
