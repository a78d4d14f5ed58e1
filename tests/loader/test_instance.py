from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from fnrt.functions.errors import FnrtError, HandlerError, InstanceStopped
from fnrt.functions.version import VersionManifest
from fnrt.runtime.node import Node
from support import assert_stages_add_up, make_node, publish, write_function

FOLDER_ARTIFACT = """
class Reader:
    def load(self, artifacts, device):
        root = artifacts["data"].path
        self.text = (root / "a.txt").read_text() + (root / "sub" / "b.txt").read_text()
        self.digest = artifacts["data"].digest

    def __call__(self, batch):
        return [{"n": [len(self.text)]} for _ in batch]
"""


def test_folder_artifacts_are_materialised_with_their_names(tmp_path: Path) -> None:
    folder = write_function(
        tmp_path / "src",
        "reader",
        FOLDER_ARTIFACT,
        manifest='name = "{name}"\nhandler = "handler:Reader"\n[artifacts]\ndata = "data"\n',
        files={"data/a.txt": b"abc", "data/sub/b.txt": b"de"},
    )
    node = make_node(tmp_path)
    vm = publish(node.repository, folder)
    executor = ThreadPoolExecutor(1)
    instance = node.loader.load(vm, executor)
    assert instance.call.text == "abcde"  # type: ignore[attr-defined]
    assert instance.call.digest == vm.artifacts["data"].digest  # type: ignore[attr-defined]
    out = instance.run([{"x": np.zeros(1)}, {"x": np.zeros(1)}])
    assert [o["n"].tolist() for o in out] == [[5], [5]]
    assert set(instance.timings_s) == {
        "files_s",  # fetch_s and verify_s are parts of it
        "fetch_s",
        "verify_s",
        "room_s",  # prepared and loaded at once: no wait for memory room
        "import_s",
        "load_s",
        "after_s",
        "total_s",
    }
    assert_stages_add_up(instance.timings_s)
    assert instance.tier == "l2"  # a store on this disk: nothing fetched
    instance.close()


def _unpacked_echo(tmp_path: Path) -> tuple[Node, VersionManifest, Path]:
    """A node, the echo function's version, and its code as the loader unpacked it."""
    node = make_node(tmp_path)
    vm = publish(node.repository, write_function(tmp_path / "src", "echo"))
    return node, vm, node.loader.code_dir(vm)


def test_an_intact_code_folder_is_checked_without_reading_its_bundle_again(
    tmp_path: Path,
) -> None:
    node, vm, code = _unpacked_echo(tmp_path)
    bundle = tmp_path / "store" / "blobs" / "sha256" / vm.bundle.digest
    bundle.unlink()  # what a disk cache that dropped the bundle would leave
    assert node.loader.code_dir(vm) == code  # its files checked against what it held
    (code / "handler.py").write_text("edited = True\n")
    with pytest.raises(FnrtError):  # a changed tree needs the bundle: it is checked
        node.loader.code_dir(vm)


def test_code_is_unpacked_compiled_and_a_module_that_does_not_compile_says_why(
    tmp_path: Path,
) -> None:
    node, _, code = _unpacked_echo(tmp_path)
    (compiled,) = (code / "__pycache__").glob("handler.*.pyc")
    flags = int.from_bytes(compiled.read_bytes()[4:8], "little")
    assert flags == 0b11  # checked against the source's hash, not its mtime
    assert compiled.name == Path(importlib.util.cache_from_source(str(code / "handler.py"))).name
    broken = write_function(tmp_path / "broken", "broken", "def Echo(batch:\n")
    with pytest.raises(HandlerError, match="SyntaxError"):
        node.loader.load(publish(node.repository, broken), ThreadPoolExecutor(1))


CONSTANT = """
from .helper import K

def Echo(batch):
    return [{"y": r["x"] * 0 + K} for r in batch]
"""


def test_two_functions_with_the_same_module_names_do_not_collide(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    one = write_function(
        tmp_path / "a",
        "one",
        files={"helper.py": b"K = 1\n"},
        handler=CONSTANT,
    )
    two = write_function(
        tmp_path / "b",
        "two",
        files={"helper.py": b"K = 2\n"},
        handler=CONSTANT,
    )
    results = []
    for folder in (one, two):
        instance = node.loader.load(publish(node.repository, folder), ThreadPoolExecutor(1))
        results.append(instance.run([{"x": np.zeros((1, 4), np.float32)}])[0]["y"][0, 0])
    assert results == [1.0, 2.0]


PAGED = """
import numpy as np
from fnrt.loader.formats import safetensors as st

class Paged:
    def load(self, artifacts, device):
        self.w = artifacts["w"].arrays()["w"]

    def __call__(self, batch):
        assert st.settled(10)  # the fill its load started has ended
        start, end = self.w.ctypes.data // 4096, (self.w.ctypes.data + self.w.nbytes) // 4096
        with open("/proc/self/pagemap", "rb") as f:  # bit 63: the page is mapped
            f.seek(start * 8)
            entries = np.frombuffer(f.read((end - start) * 8), dtype=np.uint64)
        present = int(((entries >> np.uint64(63)) & np.uint64(1)).sum())
        return [{"y": np.array([[present, end - start, 0, 0]], np.float32)} for _ in batch]
"""


@pytest.mark.parametrize("idle", [True, False], ids=["a-core-idle", "none-idle"])
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_loads_weights_are_mapped_before_its_first_batch_when_a_core_is_idle(
    tmp_path: Path, mode: str, idle: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold start's safetensors weights are mapped with their page tables filled
    beside the handler's import and load when a core is idle (their first forward then
    takes no page faults: some 7 ms of CPU on a 256 MiB model): by its first batch
    every page is mapped, in a thread instance and in a worker process alike. With no
    core idle nothing is filled ahead: the filling would take the load's own CPU."""
    from fnrt.functions.manifest import IsolationMode
    from fnrt.loader.formats import safetensors
    from fnrt.loader.launch import launch
    from support import ISOLATED_MANIFEST

    monkeypatch.setattr(safetensors, "core_idle", lambda: idle)
    folder = write_function(
        tmp_path / "src",
        "paged",
        PAGED,
        ISOLATED_MANIFEST.replace("handler:H", "handler:Paged").replace(
            "[inputs]", '[artifacts]\nw = "w.safetensors"\n\n[inputs]'
        ),
        mode=mode,
        timeout_s=0,
        memory_limit_bytes=0,
    )
    safetensors.save_arrays({"w": np.ones(4 << 20, np.float32)}, folder / "w.safetensors")
    node = make_node(tmp_path)
    vm = publish(node.repository, folder)
    instance = launch(node.loader, IsolationMode(mode), vm, ThreadPoolExecutor(1))
    try:
        ran = instance.run_timed([{"x": np.zeros((1, 4), np.float32)}])
        present, pages = ran.results[0]["y"][0][:2]
        assert pages >= 4096  # 16 MiB
        assert present == (pages if idle else 0)
    finally:
        instance.close()


MAPPED_WEIGHTS = """
class Reader:
    def load(self, artifacts, device):
        self.size = artifacts["w"].path.stat().st_size

    def __call__(self, batch):
        return [{"n": [self.size]} for _ in batch]
"""


def test_a_blob_removed_as_its_watch_starts_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch on a loaded instance's files lists the version's blobs (one gone by
    then is skipped), then reads the identity of any without a record (verified by an
    older fnrt); a blob removed in between is skipped the same way: the watch starts
    with the other files, nothing recreates it (before, the start raised
    FileNotFoundError, failing a load that had succeeded)."""
    from fnrt.loader.scrub import Scrubber

    folder = write_function(
        tmp_path / "src",
        "reader",
        MAPPED_WEIGHTS,
        manifest='name = "{name}"\nhandler = "handler:Reader"\n[artifacts]\nw = "w.bin"\n',
        files={"w.bin": b"\x07" * 4096},
    )
    node = make_node(tmp_path)
    vm = publish(node.repository, folder)
    with ThreadPoolExecutor(1) as executor:
        instance = executor.submit(node.loader.load, vm, executor).result()
    node.loader.scrubber = Scrubber()
    [mapped] = node.loader.mapped_files(vm)
    (node.loader.verifier.root / mapped.digest).unlink()  # no record: its identity is read
    listed = node.repository.blob_path

    def listed_then_removed(digest: str) -> Path | None:  # the race, made to happen
        path = listed(digest)
        if path is not None:
            path.unlink()
        return path

    monkeypatch.setattr(node.repository, "blob_path", listed_then_removed)
    watch = node.loader.watch_files(vm)
    assert watch is not None and watch.files == () and watch.check() is None
    assert not mapped.path.exists()  # nothing recreated it
    watch.close()
    instance.close()


def test_a_closed_instance_holds_nothing_of_its_handler(tmp_path: Path) -> None:
    """Closed, a generative thread instance lets go of its stepper as of its call: its
    model is freed by reference count even while the instance itself is still held
    (an executor's work item, a caller's frame), and a step says it is closed."""
    import weakref
    from typing import Any, cast

    from fnrt.functions.generation import StepBatch
    from fnrt.loader.instance import Instance

    class Model:
        def __call__(self, batch: StepBatch) -> Any:
            raise AssertionError("never stepped")

    model = Model()
    gone = weakref.ref(model)
    from fnrt.loader.repository import Repository
    from fnrt.loader.stores import FileStore

    vm = publish(Repository(FileStore(tmp_path / "store")), write_function(tmp_path / "src", "g"))
    instance = Instance(vm, lambda batch: [], ThreadPoolExecutor(1), stepper=cast(Any, model))
    del model
    instance.close()
    assert gone() is None and not instance.alive
    with pytest.raises(InstanceStopped, match="unloaded before it ran"):
        instance.step_timed(StepBatch([], []))
    with pytest.raises(InstanceStopped, match="unloaded before it ran"):
        instance.run_timed([])
