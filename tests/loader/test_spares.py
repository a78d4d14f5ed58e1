"""Spare workers: started ahead, taken by a cold start, replaced after it, and ended."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from fnrt.functions.manifest import IsolationMode
from fnrt.loader.arena import shm_dir
from fnrt.loader.device import detect_device
from fnrt.loader.environment import Environment
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.launch import launch
from fnrt.loader.priority import LOW_NICE, group_nice, own_nice, thread_nices
from fnrt.loader.process import ProcessInstance
from fnrt.loader.repository import Repository
from fnrt.loader.spares import SpareWorkers, Started, end
from fnrt.loader.stores import FileStore
from fnrt.loader.worker import installed_imports, rehearse
from support import ISOLATED_MANIFEST as MANIFEST
from support import assert_stages_add_up, made_folders, publish, wait_until, write_function

#: ``idna`` is installed with fnrt (httpx needs it) and the worker itself never imports it.
HANDLER = """
import os
import idna
import numpy as np

class H:
    def load(self, artifacts, device):
        self.pid = os.getpid()

    def __call__(self, batch):
        return [{"y": np.full((1, 4), self.pid, dtype=np.float32)} for _ in batch]
"""


@pytest.fixture
def spares() -> Iterator[SpareWorkers]:
    pool = SpareWorkers(1, refill_delay_s=0)
    yield pool
    pool.close()


def _loader(tmp_path: Path, spares: SpareWorkers) -> tuple[InstanceLoader, object]:
    repository = Repository(FileStore(tmp_path / "store"))
    folder = write_function(
        tmp_path / "src", "s", HANDLER, MANIFEST, mode="process", timeout_s=0, memory_limit_bytes=0
    )
    vm = publish(repository, folder)
    loader = InstanceLoader(repository, tmp_path / "cache", detect_device("cpu"))
    loader.spares = spares
    return loader, vm


def _cold_start(loader: InstanceLoader, vm: object) -> ProcessInstance:
    instance = launch(loader, IsolationMode.PROCESS, vm, ThreadPoolExecutor(1))  # type: ignore[arg-type]
    assert isinstance(instance, ProcessInstance)
    assert_stages_add_up(instance.timings_s)
    return instance


def _served_by(instance: ProcessInstance) -> int:
    ran = instance.run_timed([{"x": np.zeros((1, 4), dtype=np.float32)}])
    return int(ran.results[0]["y"][0, 0])


def _waiting(spares: SpareWorkers) -> list[Started]:
    """The spares once the refill after the last cold start has run."""
    spares.refill().result(30)
    return list(spares._spares)


def test_a_cold_start_takes_the_spare_and_another_replaces_it(
    tmp_path: Path, spares: SpareWorkers
) -> None:
    loader, vm = _loader(tmp_path, spares)
    first = _cold_start(loader, vm)  # nothing started ahead of a node's first cold start
    assert spares.taken == 0
    (spare,) = _waiting(spares)
    first.close()

    second = _cold_start(loader, vm)
    assert spares.taken == 1
    assert second.pid == spare.process.pid
    assert _served_by(second) == spare.process.pid  # the spare runs the handler
    # what the handler imports was imported ahead there (counted, not timed: a timing
    # compared on a loaded machine is noise; benchmarks.md has the times)
    assert "idna" in spare.imports
    (replacement,) = _waiting(spares)
    assert replacement.process.pid != spare.process.pid
    second.close()


def test_what_a_handler_imported_from_the_installed_packages_is_imported_ahead(
    tmp_path: Path, spares: SpareWorkers
) -> None:
    loader, vm = _loader(tmp_path, spares)
    instance = _cold_start(loader, vm)
    assert "idna" in spares.learned
    (spare,) = _waiting(spares)
    assert "idna" in spare.imports
    assert "--spare" in spare.process.args  # type: ignore[operator]
    # the handler's own modules never are: they live in its code folder
    assert not any(name.startswith("fnrt") for name in spares.learned)
    instance.close()


def test_a_spare_that_lacks_a_module_learned_since_is_replaced() -> None:
    pool = SpareWorkers(1, refill_delay_s=0)
    try:
        (old,) = _waiting(pool)
        assert old.imports == frozenset()
        pool.learn(["idna"])
        (new,) = _waiting(pool)
        assert new.imports == {"idna"}
        assert old.process.wait(10) is not None  # ended, not left behind
    finally:
        pool.close()
    assert new.process.wait(10) is not None


def test_a_dead_spare_is_passed_over(tmp_path: Path, spares: SpareWorkers) -> None:
    loader, vm = _loader(tmp_path, spares)
    _cold_start(loader, vm).close()
    (spare,) = _waiting(spares)
    spare.process.kill()
    spare.process.wait(10)

    instance = _cold_start(loader, vm)  # a worker of its own, started now
    assert spares.taken == 0
    assert instance.pid != spare.process.pid
    assert _served_by(instance) == instance.pid
    instance.close()


def test_named_imports_are_imported_by_every_spare_and_close_ends_them() -> None:
    pool = SpareWorkers(2, ["idna"], refill_delay_s=0)
    (a, b) = _waiting(pool)
    assert a.imports == b.imports == {"idna"}
    pool.close()
    assert a.process.wait(10) is not None and b.process.wait(10) is not None
    pool.refill().result(10)  # after close nothing starts
    assert pool.ready == 0 and pool.take() is None


def test_only_modules_of_the_installed_packages_are_reported(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text("X = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        before = set(sys.modules) - {"idna", "mine", "idna.core"}
        import idna  # noqa: F401
        import mine  # type: ignore[import-not-found]  # noqa: F401

        found = installed_imports(before)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mine", None)
    assert "idna" in found
    assert "mine" not in found  # on a path of its own: a spare must not shadow it


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(ValueError, match="count"):
        SpareWorkers(-1)


def test_a_replacement_waits_for_the_delay_and_a_close_meanwhile_starts_none() -> None:
    pool = SpareWorkers(1, refill_delay_s=60)
    waiting = pool.refill()  # as after a cold start's load: its first batch runs first
    assert pool.ready == 0 and not waiting.done()
    started = time.monotonic()
    pool.close()  # does not wait out the delay
    assert waiting.done() and time.monotonic() - started < 10
    assert pool.ready == 0


def test_a_rehearsal_leaves_nothing_behind() -> None:
    import torch  # imported: the rehearsal's torch part runs too

    modules = set(sys.modules)
    with made_folders() as made:
        rehearse()
    assert made and all(folder.parent == shm_dir() for folder in made)
    assert not [folder for folder in made if folder.exists()]
    assert not {m for m in sys.modules if m.startswith("fnrt_bundle_")} - modules
    assert torch.is_grad_enabled()  # nothing of it stays


def test_what_was_learned_is_kept_for_the_next_start_on_this_cache(tmp_path: Path) -> None:
    kept = tmp_path / "spares" / "imports.json"
    first = SpareWorkers(1, remembered=kept)
    assert not first.known
    first.learn(["idna", "numpy"])
    first.learn(["idna"])  # nothing new: nothing written
    first.close()
    again = SpareWorkers(1, ["torch"], remembered=kept)
    assert again.learned == {"idna", "numpy"} and again.known
    assert again.imports == {"idna", "numpy", "torch"}
    again.close()
    for bad in ("{not json", '{"a": 1}', '["ok", 3, "not a name"]'):
        kept.write_text(bad)
        pool = SpareWorkers(1, remembered=kept)
        assert pool.learned <= {"ok"}  # what cannot be read is left out, nothing raised
        pool.close()


def test_what_a_version_imports_is_learned_where_it_is_installed() -> None:
    pool = SpareWorkers(1, refill_delay_s=0)
    try:
        pool.expect(["not_a_package_anywhere_here", "numpy"], refill=False)
        assert pool.learned == {"numpy"} and pool.ready == 0  # learned, nothing started
        pool.expect(["idna"])  # new: the spares are brought up to date
        wait_until(lambda: pool.ready == 1)
        (spare,) = pool._spares
        assert spare.imports == {"idna", "numpy"}
    finally:
        pool.close()


def _environment(tmp_path: Path, key: str) -> Environment:
    """An ``[environment]`` folder by hand (no pip): one module that, imported, leaves
    a file named by the importing process's pid."""
    built = Environment(key, tmp_path / key, ())
    built.site.mkdir(parents=True)
    marks = tmp_path / f"imported-{key}"
    marks.mkdir()
    (built.site / f"envmod_{key}.py").write_text(
        f"import os, pathlib\npathlib.Path({str(marks)!r}, str(os.getpid())).touch()\n"
    )
    return built


def test_an_environment_keeps_spares_of_its_own_after_a_cold_start_in_it(
    tmp_path: Path,
) -> None:
    pool = SpareWorkers(1, refill_delay_s=0)
    try:
        envs = [_environment(tmp_path, key) for key in ("a", "b", "c")]
        assert pool.take("a") is None  # no cold start in it yet: none
        pool.learn_environment(envs[0], ["envmod_a"])
        pool.refill().result(30)
        (own,) = pool._spares  # the server's own: without the environment's modules
        assert own.imports == frozenset() and "--site" not in own.process.args  # type: ignore[operator]
        spare = pool.take("a")
        assert spare is not None and spare.imports == {"envmod_a"}
        assert str(envs[0].site) in spare.process.args  # type: ignore[operator]
        # it imported the module from its environment's folder ahead of any load
        wait_until(lambda: (tmp_path / "imported-a" / str(spare.process.pid)).exists())
        assert pool.take("a") is None and pool.taken == 1
        end(spare)

        # the two environments last cold-started keep theirs; the oldest's spares end
        pool.refill().result(30)
        (kept_a,) = pool._environments["a"].spares
        pool.learn_environment(envs[1], ["envmod_b"])
        pool.learn_environment(envs[2], ["envmod_c"])
        assert list(pool._environments) == ["b", "c"]
        assert kept_a.process.wait(10) is not None
        pool.refill().result(30)
        assert pool.ready == 3  # the server's, b's and c's
        assert pool.take("a") is None
    finally:
        pool.close()
    assert pool.ready == 0


def test_what_a_version_in_an_environment_imports_is_learned_where_it_is_installed(
    tmp_path: Path,
) -> None:
    pool = SpareWorkers(1, refill_delay_s=0)
    try:
        built = _environment(tmp_path, "a")
        pool.expect_environment(built, ["envmod_a", "idna", "not_a_package_anywhere_here"])
        wait_until(lambda: len(pool._environments["a"].spares) == 1, timeout_s=30)
        (spare,) = pool._environments["a"].spares
        assert spare.imports == {"envmod_a", "idna"}  # its folder's, and the node's
        assert pool.learned == set()  # the server's own spares learn nothing of it
        assert not pool.learn_environment(built, ["idna"])  # nothing new
    finally:
        pool.close()


def test_modules_of_an_environment_folder_are_reported_as_installed(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "envonly.py").write_text("X = 1\n")
    sys.path.insert(0, str(site))
    try:
        before = set(sys.modules) - {"envonly"}
        import envonly  # type: ignore[import-not-found]  # noqa: F401

        assert "envonly" not in installed_imports(before)  # a path of its own
        assert "envonly" in installed_imports(before, [str(site)])  # its environment's
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("envonly", None)


def test_a_spare_says_when_it_is_warm_and_a_deploy_gets_one_at_once() -> None:
    pool = SpareWorkers(1, refill_delay_s=600)  # a delayed refill would wait ten minutes
    try:
        pool.learn(["idna"])
        pool.refill()  # the delayed one, queued first
        started = time.monotonic()
        # a deploy: the refill runs now, and it answers once the spare's imports are done
        assert pool.ready_for(["idna"], timeout_s=60)
        assert time.monotonic() - started < 60
        (spare,) = pool._spares
        assert spare.imports == {"idna"} and not spare.warming
        taken = pool.take()
        assert taken is spare and taken.wait_ready(0)
        end(taken)
    finally:
        pool.close()


def test_a_cold_start_that_takes_a_spare_still_warming_waits_for_it() -> None:
    pool = SpareWorkers(1, refill_delay_s=0)
    try:
        pool.learn(["idna"])
        pool.refill().result(30)
        (spare,) = pool._spares
        assert spare.warming  # its imports under way (nobody has waited for it yet)
        taken = pool.take()
        assert taken is spare and not taken.warming  # take waited: the cold start's worker_s
        end(taken)
    finally:
        pool.close()


def test_a_deploy_gets_no_worker_from_a_pool_that_keeps_none() -> None:
    pool = SpareWorkers(0)
    try:
        assert not pool.ready_for(["idna"], timeout_s=60)  # at once, not after a minute
    finally:
        pool.close()


#: A module a spare imports ahead that holds its import until the test lets it go: it
#: opens a FIFO for reading (the test sees it as a reader) and reads it to its end.
GATE = """
import os

with open(os.environ["FNRT_TEST_GATE"], "rb") as fifo:
    fifo.read()
"""


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A FIFO that the module ``fnrt_test_gate`` (on the workers' path) waits on."""
    (tmp_path / "gated").mkdir()
    (tmp_path / "gated" / "fnrt_test_gate.py").write_text(GATE)
    fifo = tmp_path / "gate.fifo"
    os.mkfifo(fifo)
    path = os.pathsep.join(p for p in (str(tmp_path / "gated"), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("FNRT_TEST_GATE", str(fifo))
    return fifo


def _importing(fifo: Path) -> int:
    """Wait until a spare's import of ``fnrt_test_gate`` holds ``fifo`` open; the end to
    close to let it go."""
    found: list[int] = []

    def opened() -> bool:
        try:  # no reader yet: ENXIO
            found.append(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            return False
        return True

    wait_until(opened, timeout_s=60)
    return found[0]


def _above_main(pid: int) -> dict[int, int]:
    """The threads of ``pid`` whose nice value is above its main thread's, and by how much."""
    nices = thread_nices(pid)
    return {tid: nice - nices[pid] for tid, nice in nices.items() if nice > nices[pid]}


def _may_raise_priority() -> bool:
    """Whether this process may lower a nice value (CAP_SYS_NICE or RLIMIT_NICE)."""
    allowed: list[bool] = []

    def probe() -> None:
        tid, nice = threading.get_native_id(), own_nice()
        os.setpriority(os.PRIO_PROCESS, tid, nice + 1)
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
            allowed.append(True)
        except PermissionError:
            allowed.append(False)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return allowed[0]


def test_a_replacement_imports_at_the_lowest_priority_and_serves_at_the_servers(
    tmp_path: Path, gate: Path
) -> None:
    pool = SpareWorkers(1, ["fnrt_test_gate"], refill_delay_s=0)
    try:
        pool.refill()  # a replacement, as after a cold start's load: nobody waits for it
        held = _importing(gate)
        (spare,) = pool._spares
        # its imports on a thread of their own at the lowest priority, its main thread
        # (which will serve) at the server's
        assert list(_above_main(spare.process.pid).values()) == [LOW_NICE]
        assert thread_nices(spare.process.pid)[spare.process.pid] == own_nice()
        # and its session's scheduling group, which is what meets the server's (autogroups)
        assert group_nice(spare.process.pid) in (None, LOW_NICE)
        os.close(held)
        assert spare.wait_ready(60)
        assert group_nice(spare.process.pid) in (None, 0)  # back once its imports are done
        loader, vm = _loader(tmp_path, pool)
        instance = _cold_start(loader, vm)  # takes it
        assert _served_by(instance) == spare.process.pid
        assert not _above_main(instance.pid)  # every thread serves at the server's priority
        instance.close()
    finally:
        pool.close()


def test_a_spare_a_deploy_or_the_start_waits_for_imports_at_the_servers_priority(
    gate: Path,
) -> None:
    pool = SpareWorkers(1, ["fnrt_test_gate"], refill_delay_s=600)
    try:
        pool.refill()  # delayed (ten minutes) ...
        pool.refill(now=True)  # ... and hurried: as ready_for and the node's start do
        held = _importing(gate)
        (spare,) = pool._spares
        assert not _above_main(spare.process.pid)
        assert group_nice(spare.process.pid) in (None, 0)
        os.close(held)
        assert spare.wait_ready(60)
    finally:
        pool.close()


@pytest.mark.skipif(not _may_raise_priority(), reason="needs CAP_SYS_NICE or RLIMIT_NICE")
def test_a_cold_start_raises_a_replacement_still_warming_before_it_waits(gate: Path) -> None:
    pool = SpareWorkers(1, ["fnrt_test_gate"], refill_delay_s=0)
    try:
        pool.refill()
        held = _importing(gate)
        (spare,) = pool._spares
        assert _above_main(spare.process.pid)
        with ThreadPoolExecutor(1) as waiting:
            taking = waiting.submit(pool.take)  # a cold start: it waits for the imports
            wait_until(lambda: not _above_main(spare.process.pid), timeout_s=30)
            assert group_nice(spare.process.pid) in (None, 0)
            assert not taking.done()
            os.close(held)
            assert taking.result(60) is spare
        end(spare)
    finally:
        pool.close()


TAKE_UNPRIVILEGED = """
import os, sys, time
from concurrent.futures import ThreadPoolExecutor
from fnrt.loader.priority import LOW_NICE, group_nice, thread_nices
from fnrt.loader.spares import SpareWorkers, end

pool = SpareWorkers(1, ["fnrt_test_gate"], refill_delay_s=0)
pool.refill()
fd = None
deadline = time.monotonic() + 60
while fd is None and time.monotonic() < deadline:
    try:
        fd = os.open(os.environ["FNRT_TEST_GATE"], os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        time.sleep(0.005)
(spare,) = pool._spares
nices = thread_nices(spare.process.pid)
print("threads above its main one while warming:", max(nices.values()) - nices[spare.process.pid])
print("its group low while warming:", group_nice(spare.process.pid) in (None, LOW_NICE))
with ThreadPoolExecutor(1) as taking:
    took = taking.submit(pool.take)
    deadline = time.monotonic() + 30
    raised = lambda: not pool._spares and group_nice(spare.process.pid) in (None, 0)
    while not raised() and not took.done() and time.monotonic() < deadline:
        time.sleep(0.005)  # taken and hurried: the cold start waits for its imports
    print("its group raised for the cold start:", raised())
    os.close(fd)
    print("taken while warming:", took.result(60) is spare)
print("spares left in the pool:", pool.ready)
end(spare)
pool.close()
"""


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_without_the_right_to_raise_it_a_cold_start_takes_a_replacement_still_warming(
    gate: Path,
) -> None:
    """The "server" runs without CAP_SYS_NICE and with RLIMIT_NICE 0: it could not raise
    a thread's nice value back, so a replacement's imports run at the server's (only its
    session's group is lowered, which needs no right to raise again), and a cold start
    takes it while it warms, as with the right, rather than start a worker of its own
    (before: passed over, the replacement left at nice 19, an extra worker started)."""
    argv = [sys.executable, "-c", TAKE_UNPRIVILEGED]
    if os.geteuid() == 0 or _may_raise_priority():
        drop = ["--inh-caps=-sys_nice", "--ambient-caps=-sys_nice", "--bounding-set=-sys_nice"]
        argv = ["setpriv", *drop, "prlimit", "--nice=0", "--", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "threads above its main one while warming: 0",
        "its group low while warming: True",
        "its group raised for the cold start: True",
        "taken while warming: True",
        "spares left in the pool: 0",
    ]
