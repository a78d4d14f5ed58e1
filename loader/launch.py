"""Starting an instance of a version where its isolation says, in two steps
(:class:`Launch`): what holds no memory readied (:func:`prepare`: its environment
ready, its files materialised), then a worker process (:func:`spawn`: a spare
worker taken or one started, the handler loaded there) or a thread here
(``InstanceLoader.load``); and the deploy-time check of a handler in its
environment's worker.

The worker itself, once started, is :class:`~fnrt.loader.process.ProcessInstance`'s.
"""

from __future__ import annotations

import json
import logging
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from fnrt.functions.errors import EnvironmentFailed, HandlerError, Unavailable
from fnrt.functions.manifest import IsolationMode
from fnrt.functions.version import VersionManifest
from fnrt.loader.arena import shm_dir
from fnrt.loader.channel import Channel
from fnrt.loader.environment import Environment
from fnrt.loader.instance import InstanceLoader, Prepared, Runnable, map_ahead_now
from fnrt.loader.process import LOAD_TIMEOUT_S, ProcessInstance
from fnrt.loader.spares import end, start_worker

log = logging.getLogger("fnrt.loader")

#: Told, on the load's thread, the worker instance whose load message was just sent.
OnSent = Callable[[ProcessInstance], None]

MIB = 1 << 20
FIGURES_KEPT = 64  # the figures of workers' own memory a node keeps (steady_bytes)


def spawn(
    loader: InstanceLoader,
    vm: VersionManifest,
    executor: Executor,
    prepared: Prepared | None = None,
    on_sent: OnSent | None = None,
) -> Runnable:
    """Start a worker process for ``vm`` and load its handler there (blocking), from
    what :func:`prepare` readied (now when None); the instance owns its pins.
    ``on_sent`` is handed the instance once its load message is sent (a first batch
    may follow it then: ``ProcessInstance.send_early``).

    The files are materialised by :func:`prepare` (fetched, verified, pinned in
    the disk cache); the worker maps them itself. RemoteError if the handler's import or
    ``load`` raised, InstanceLost if the worker died or was killed while loading.

    ``timings_s`` has the stages of the cold start, which add up to its
    ``total_s``: environment_s (its [environment] ready), files_s (materialised:
    fetch_s and verify_s are part of it), room_s (the wait since, for room in the
    node's memory), worker_s (a spare taken or a process started), import_s and
    load_s (in the worker: the handler's imports, its ``load`` with the weights
    mapped), setup_s (the rest of the load message's round trip: sending it, the
    worker's unpickling and arenas, and, with no spare ready, the new process's own
    start: its interpreter and fnrt's imports) and after_s (what the server does
    with the reply).
    """
    if prepared is None:
        prepared = prepare(loader, IsolationMode.PROCESS, vm)
    files, environment = prepared.files, prepared.environment
    materialised = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix=f"fnrt-{vm.name}-", dir=shm_dir()))
    spares = loader.spares
    key = environment.key if environment is not None else None
    started = spares.take(key) if spares is not None else None
    spare = started is not None
    try:
        if started is None:
            started = start_worker(
                worker_env(environment), site=environment.site if environment else None
            )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        loader.unpin(files.pinned)
        raise
    try:
        instance = ProcessInstance(
            vm,
            executor,
            started.process,
            Channel(started.sock),
            workdir,
            lambda: loader.unpin(files.pinned),
        )
    except BaseException:  # its arenas or its memory watch: the worker ends here
        end(started)
        shutil.rmtree(workdir, ignore_errors=True)
        loader.unpin(files.pinned)
        if spares is not None:
            spares.refill()
        raise
    device = loader.device_for(vm)
    instance.device = device
    sent = time.perf_counter()
    try:
        reply = instance.start(
            {
                "op": "load",
                # pickled: the worker is this fnrt, and the manifest was checked when it
                # was stored (re-parsing it there took 0.5 ms of every cold start)
                "version": pickle.dumps(vm, pickle.HIGHEST_PROTOCOL),
                "code_dir": str(files.code_dir),
                "device": [device.kind, device.index],
                "artifacts": {
                    key: [str(a.path), a.digest, a.size_bytes] for key, a in files.artifacts.items()
                },
                # its weights mapped ahead, their page tables filled beside the handler's
                # import and load, when a core is idle now to do it
                "map_ahead": map_ahead_now(),
            },
            on_sent,
        )
    except BaseException:
        instance.abandon()
        if spares is not None:
            spares.refill()
        raise
    finally:
        loader.placed(device, vm)
    replied = time.perf_counter()
    if spares is not None:  # after the load, not during it: its imports would slow it
        if environment is None:
            spares.learn(reply.get("modules", ()))
        else:
            spares.learn_environment(environment, reply.get("modules", ()))
        spares.refill()
    # A worker's interpreter (and the imports it had when taken) and its page-locked
    # ring count in host memory beside the model: a node of many small models in
    # worker processes holds mostly interpreters. Its CUDA context, cuBLAS's workspace
    # and torch's cache, measured in the worker, count on its GPU.
    instance.interpreter_bytes = worker_bytes_of(loader, int(reply.get("interpreter_bytes", 0)))
    instance.size_bytes = (
        int(reply["size_bytes"]) + int(reply.get("pinned_bytes", 0)) + instance.interpreter_bytes
    )
    instance.device_bytes = int(reply.get("device_bytes", 0)) + int(reply.get("context_bytes", 0))
    instance.context_bytes = int(reply.get("context_bytes", 0))
    instance.stages = bool(reply.get("staged", False))
    instance.tier = files.tier
    import_s, load_s = float(reply["import_s"]), float(reply["load_s"])
    done = time.perf_counter()
    instance.timings_s = {
        **prepared.timings_s(materialised),
        "worker_s": sent - materialised,
        "import_s": import_s,
        "load_s": load_s,
        "setup_s": max(replied - sent - import_s - load_s, 0.0),
        "after_s": done - replied,
        "total_s": done - prepared.started,
    }
    log.info(
        "worker %d%s serves %s %s on %s",
        instance.pid,
        " (a spare)" if spare else "",
        vm.name,
        vm.version,
        device,
    )
    return instance


def environment_of(loader: InstanceLoader, vm: VersionManifest) -> Environment | None:
    """``vm``'s ``[environment]`` (built here on first use), or None: the server's own."""
    requirements = vm.manifest.environment.requirements
    if not requirements:
        return None
    return loader.environments.ensure(requirements)


def worker_env(environment: Environment | None) -> dict[str, str] | None:
    """The environment variables of a worker in ``environment`` (None: the server's)."""
    return environment.worker_variables() if environment is not None else None


def check_in_environment(loader: InstanceLoader, vm: VersionManifest) -> None:
    """Import ``vm``'s handler and check its contract in a worker of its environment
    (deploy-time); HandlerError with the worker's words if it fails."""
    code = loader.code_dir(vm)
    done = subprocess.run(
        [sys.executable, "-m", "fnrt.loader.worker", "--check", str(code)],
        input=json.dumps(vm.to_dict()),
        capture_output=True,
        text=True,
        env=worker_env(environment_of(loader, vm)),
        timeout=LOAD_TIMEOUT_S,
    )
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise HandlerError(said[-1] if said else f"the handler check exited {done.returncode}")


def prepare(loader: InstanceLoader, kind: IsolationMode, vm: VersionManifest) -> Prepared:
    """What a load of ``vm`` where ``kind`` says needs that holds none of the node's
    memory, readied (blocking): its files on this disk, pinned, and a worker's
    ``[environment]`` (Unavailable when this node cannot build it)."""
    if kind is not IsolationMode.PROCESS:
        return loader.prepare(vm)

    def environment() -> Environment | None:
        try:  # before the files are pinned: a first build on this node may take long
            return environment_of(loader, vm)
        except EnvironmentFailed as exc:  # deployed elsewhere; this node cannot build it
            raise Unavailable(
                f"function '{vm.name}': its environment cannot be built on this node: {exc.message}"
            ) from None

    return loader.prepare(vm, environment)


def steady_bytes(known: Sequence[int], measured: int) -> int:
    """What a worker counts of its own memory, from its ``measured`` heap: the figure of
    those the node ``known`` nearest to it, if it is within an eighth of that figure,
    else ``measured``. A worker's heap moves by a MiB or so from one start to the
    next; the budget's choices, and the plans priced by each instance's size, should
    not move with it, and two functions whose workers hold alike weigh alike. (A
    worker counts at most an eighth less than it measured.)"""
    near = [f for f in known if abs(measured - f) <= f // 8]
    return min(near, key=lambda f: abs(measured - f)) if near else measured


def worker_bytes_of(loader: InstanceLoader, measured: int) -> int:
    """What a new worker counts of its own (:func:`steady_bytes`, to the MiB), from its
    ``measured`` heap. The figures are the node's (the last used kept, at most
    :data:`FIGURES_KEPT`); a version never loaded in a worker expects the largest."""
    if not measured:
        return 0
    with loader.worker_sizes_lock:  # (loads spawn their workers side by side)
        known = loader.worker_sizes
        figure = steady_bytes(known, -(-measured // MIB) * MIB)
        if figure in known:
            known.remove(figure)
        known.append(figure)  # the last used last
        del known[:-FIGURES_KEPT]
        loader.worker_bytes = max(known)
    return figure


def worker_bytes(loader: InstanceLoader, kind: IsolationMode) -> int:
    """What an instance where ``kind`` says holds in host memory besides its model's: in
    a worker process, the worker's own (the largest figure the node's workers count,
    :func:`worker_bytes_of`; 0 before one has loaded)."""
    return loader.worker_bytes if kind is IsolationMode.PROCESS else 0


def launch(
    loader: InstanceLoader,
    kind: IsolationMode,
    vm: VersionManifest,
    executor: Executor,
    prepared: Prepared | None = None,
    on_sent: OnSent | None = None,
) -> Runnable:
    """An instance of ``vm`` where ``kind`` says: a thread here, or a worker process;
    from what :func:`prepare` readied (now when None). ``on_sent``: :func:`spawn`'s
    (a thread's load sends nothing)."""
    if kind is IsolationMode.PROCESS:
        return spawn(loader, vm, executor, prepared, on_sent)
    return loader.load(vm, executor, prepared)


@dataclass(frozen=True)
class Launch:
    """The node's load of a version's instances in two steps: what holds no memory
    readied first (:meth:`prepare`: a store that fails or a build that cannot be
    made raises there), then, once the memory budgets have made room, the instance
    loaded from it (:meth:`load`). Called whole, it does both (a ``LoadInstance``)."""

    loader: InstanceLoader
    kind: IsolationMode

    def prepare(self, vm: VersionManifest) -> Prepared:
        return prepare(self.loader, self.kind, vm)

    def load(
        self,
        vm: VersionManifest,
        executor: Executor,
        prepared: Prepared,
        on_sent: OnSent | None = None,
    ) -> Runnable:
        """The instance, from ``prepared`` (its pins are the instance's from here);
        ``on_sent``: :func:`spawn`'s."""
        return launch(self.loader, self.kind, vm, executor, prepared, on_sent)

    def worker_bytes(self) -> int:
        """What its instances hold besides their model's (:func:`worker_bytes`)."""
        return worker_bytes(self.loader, self.kind)

    def give_back(self, prepared: Prepared) -> None:
        """``prepared`` will not be loaded: its files are unpinned."""
        self.loader.unpin(prepared.files.pinned)

    def __call__(self, vm: VersionManifest, executor: Executor) -> Runnable:
        return launch(self.loader, self.kind, vm, executor)
