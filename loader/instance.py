"""Turning a version manifest into a running instance of its handler.

Everything here blocks (file I/O, imports, the handler's ``load``); the runtime
calls it on the instance's own executor thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import compileall
import functools
import inspect
import logging
import os
import py_compile
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import numpy as np

from fnrt.functions.bundle import unpack_code
from fnrt.functions.errors import BlobNotFound, InstanceLost, InstanceStopped
from fnrt.functions.extras import require
from fnrt.functions.generation import StepBatch, Stepped
from fnrt.functions.handler import (
    Device,
    Request,
    bundle_package,
    defines_forward,
    import_handler,
)
from fnrt.functions.tensors import coerce_result
from fnrt.functions.version import ArtifactRef, FileRef, VersionManifest, check_rel
from fnrt.loader.artifact import LocalArtifact
from fnrt.loader.cache import BlobCache
from fnrt.loader.environment import Environment, Environments
from fnrt.loader.formats import safetensors as safetensors_format
from fnrt.loader.formats.safetensors import MappedAhead
from fnrt.loader.integrity import (
    Record,
    Verifier,
    bundle_files,
    identity,
    quick_digest,
    read_record,
    tree_differences,
)
from fnrt.loader.placement import Placement
from fnrt.loader.repository import Repository
from fnrt.loader.scrub import Mapped, Scrubber, Watch
from fnrt.loader.spares import SpareWorkers
from fnrt.loader.staging import Ahead, Staged, Stager
from fnrt.loader.stepper import Stepper
from fnrt.loader.streams import Lanes, lanes_for, warm_libraries
from fnrt.tracing.handler_spans import TraceParent, capture

log = logging.getLogger("fnrt.loader")

T = TypeVar("T")


class LoadTier(StrEnum):
    """Where a loaded instance's bytes came from."""

    L2 = "l2"  # this machine's disk: the disk cache, or a folder store
    L3 = "l3"  # the object store (fetched for this load)


@dataclass(frozen=True)
class Ran:
    """One batch's checked results, with the handler's time and the result checks' time."""

    results: list[dict[str, np.ndarray[Any, Any]]]
    infer_s: float
    output_s: float
    spans: list[dict[str, Any]] = field(default_factory=list)  # the handler's own (OTel API)


@dataclass
class Instance:
    """A loaded handler with the thread it runs on.

    ``run`` is called on ``executor``'s single thread: the same thread that ran
    ``load``, so thread-bound state (CUDA streams, torch settings) carries over.
    """

    version: VersionManifest
    call: Callable[[list[Request]], Sequence[Any]]
    executor: Executor
    unload: Callable[[], None] | None = None
    timings_s: dict[str, float] = field(default_factory=dict)
    size_bytes: int = 0
    tier: LoadTier = LoadTier.L2
    stepper: Stepper | None = None  # a generative handler's
    stager: Stager | None = None  # a handler with forward(): batches can be staged ahead
    device_bytes: int = 0  # held in device memory (``size_bytes``: in host memory)
    device: Device = field(default_factory=Device)  # where it runs: a GPU of the node, or the CPU
    apart = False  # its handler runs in this process, on its thread (Runnable.apart)

    def run(self, batch: list[Request]) -> list[dict[str, np.ndarray[Any, Any]]]:
        """Call the handler on one batch; raise ValueError if it breaks the contract."""
        return self.run_timed(batch).results

    def run_timed(self, batch: list[Request], trace: TraceParent | None = None) -> Ran:
        """:meth:`run`, also timing the handler and the checking of its results; spans the
        handler makes through the OpenTelemetry API go under ``trace`` (the batch's span)."""
        call = self.call  # read once: an unload on another thread may close it meanwhile
        if call is _closed:
            raise self.stopped()
        if trace is None:  # not traced (the common case): nothing to set up per batch
            return run_checked(call, self.version, batch)
        with capture(trace) as spans:
            ran = run_checked(call, self.version, batch)
        return replace(ran, spans=spans) if spans else ran

    def run_soon(
        self, batch: list[Request], trace: TraceParent | None = None
    ) -> asyncio.Future[Ran]:
        """:meth:`run_timed` on the instance's thread (the handler runs in this process
        and must not hold up the event loop); the future of what it ran."""
        return asyncio.get_running_loop().run_in_executor(
            self.executor, self.run_timed, batch, trace
        )

    @property
    def stages(self) -> bool:
        """A handler with forward(): its requests' inputs must agree on rows."""
        return self.stager is not None

    def stage_soon(self, batch: list[Request], traced: bool = True) -> asyncio.Future[Staged]:
        """Stage ``batch`` on the stager's host lane while this instance computes another
        (``traced``: a worker's concern; a thread's handler spans go under its batch's)."""
        stager = self.stager
        assert stager is not None
        return asyncio.get_running_loop().run_in_executor(stager.host_lane, stager.stage, batch)

    def run_staged_soon(
        self, staged: Staged, trace: TraceParent | None = None
    ) -> asyncio.Future[Ran]:
        """:meth:`run_staged` on the instance's thread; the future of what it ran."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self.executor, self.run_staged, staged, trace)

    def run_staged(self, staged: Staged, trace: TraceParent | None = None) -> Ran:
        """Compute a batch the stager staged ahead on its host lane (this instance's thread)."""
        stager = self.stager
        if stager is None or self.call is _closed:
            if stager is not None:
                stager.release(staged)
            raise self.stopped()
        if trace is None:
            results, times = stager.compute(staged)
            return Ran(results, times.compute_s, times.output_s)
        with capture(trace) as spans:
            results, times = stager.compute(staged)
        return Ran(results, times.compute_s, times.output_s, spans)

    def step_soon(
        self, batch: StepBatch, trace: TraceParent | None = None
    ) -> asyncio.Future[Stepped]:
        """:meth:`step_timed` on the instance's thread; the future of the step."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self.executor, self.step_timed, batch, trace)

    def step_timed(self, batch: StepBatch, trace: TraceParent | None = None) -> Stepped:
        """One step of a generative handler (its handler spans go under ``trace``)."""
        stepper = self.stepper
        if self.call is _closed:
            raise self.stopped()
        if stepper is None:
            raise RuntimeError("not a generative handler")
        if trace is None:
            return stepper(batch)
        with capture(trace) as spans:
            stepped = stepper(batch)
        return replace(stepped, spans=spans) if spans else stepped

    @property
    def alive(self) -> bool:
        """A thread instance lives until it is closed."""
        return self.call is not _closed

    def ended(self) -> InstanceLost:
        """Why it is not alive: closed (it is never found so in a slot)."""
        return InstanceLost(self.version.name, "", "the instance was closed", cause="exit")

    def stopped(self) -> InstanceStopped:
        """What work that reaches the instance after it was closed raises: a batch or step
        queued on its thread just before an unload (503, retry), not a handler failure."""
        return InstanceStopped(self.version.name, "its instance was unloaded before it ran")

    def abandon(self) -> None:
        """Give up on an instance whose thread is stuck in the handler: it cannot be
        stopped, so it is left to finish on its own and never used again."""
        self.executor.shutdown(wait=False)
        self._let_go()

    def close(self) -> None:
        """Run the handler's ``unload`` (if any) on its thread and stop the thread."""
        if self.unload is not None:
            try:
                self.executor.submit(self.unload).result()
            except Exception:
                log.exception("unload of %s %s failed", self.version.name, self.version.version)
        self.executor.shutdown(wait=False)
        self._let_go()

    def _let_go(self) -> None:
        """Hold nothing of the handler's: an ended instance may outlive its unload a
        while (an executor's work item, a caller's frame), its model need not."""
        self.call = _closed
        self.unload = None
        self.stager = None
        self.stepper = None


def run_checked(
    call: Callable[[list[Request]], Sequence[Any]], vm: VersionManifest, batch: list[Request]
) -> Ran:
    """Call a handler on one batch and check what it returned against the contract
    (one result per request, outputs as declared); ValueError if it broke it."""
    start = time.perf_counter()
    results = call(batch)
    called = time.perf_counter()
    if isinstance(results, dict | str | bytes) or not isinstance(results, Sequence):
        raise ValueError(
            f"handler must return a list with one result per request, got {type(results).__name__}"
        )
    if len(results) != len(batch):
        raise ValueError(
            f"handler returned {len(results)} results for a batch of {len(batch)} requests"
        )
    outputs = vm.manifest.outputs
    checked = [coerce_result(outputs, r) for r in results]
    return Ran(checked, called - start, time.perf_counter() - called)


#: The stages of a cold start, in order, which add up to its ``total_s``: its
#: ``[environment]`` ready, its files materialised (``fetch_s`` and ``verify_s`` are
#: parts of ``files_s``), the wait for room in the node's memory (evictions, and what
#: they freed collected), a worker taken or started, the handler's imports and ``load``,
#: the rest of the load's round trip, what follows it, and the instance's first batch
#: (or step): lazy set-up and warm-up land there. A thread instance has no
#: ``environment_s``, ``worker_s`` or ``setup_s``.
STAGES = (
    "environment_s",
    "files_s",
    "room_s",
    "worker_s",
    "import_s",
    "load_s",
    "setup_s",
    "after_s",
    "first_batch_s",
)


def stage_sum(timings: Mapping[str, float]) -> float:
    """The seconds a cold start's recorded stages add up to (against its ``total_s``)."""
    return sum(timings.get(stage, 0.0) for stage in STAGES)


def add_first_batch(timings: dict[str, float], seconds: float) -> None:
    """The first batch of a new instance took ``seconds``: its cold start's last stage."""
    timings["first_batch_s"] = seconds
    timings["total_s"] = timings.get("total_s", 0.0) + seconds


class Runnable(Protocol):
    """What the instance pool holds: an instance in a thread or in a worker process.

    ``run_timed`` is called on ``executor``'s one thread, ``run_soon`` on the event
    loop; ``close`` ends the instance (its handler's ``unload``, then its thread or
    process).
    """

    version: VersionManifest
    executor: Executor
    timings_s: dict[str, float]
    size_bytes: int  # held in host memory
    device_bytes: int  # held in device memory (a GPU's)
    device: Device  # where it runs
    tier: LoadTier
    #: its batches compute in another process (a worker): the event loop is free while
    #: one runs
    apart: bool

    @property
    def alive(self) -> bool: ...

    def ended(self) -> InstanceLost:
        """Why an instance that is not alive ended (its cause, for the restart counts);
        blocking: a worker's exit is waited for."""
        ...

    def run_timed(self, batch: list[Request], trace: TraceParent | None = None) -> Ran: ...

    def run_soon(
        self, batch: list[Request], trace: TraceParent | None = None
    ) -> asyncio.Future[Ran]:
        """A batch started from the event loop: on ``executor``'s thread (a thread
        instance), or sent to the worker with its reply awaited on the loop (a worker
        process's); cancelling the future stops waiting for it."""
        ...

    def step_timed(self, batch: StepBatch, trace: TraceParent | None = None) -> Stepped: ...

    def step_soon(
        self, batch: StepBatch, trace: TraceParent | None = None
    ) -> asyncio.Future[Stepped]:
        """A step started from the event loop, as ``run_soon`` starts a batch."""
        ...

    @property
    def stages(self) -> bool:
        """A handler with forward(): it stacks its batches itself (a worker's too)."""
        ...

    @property
    def stager(self) -> Ahead | None:
        """Stages batches ahead while one computes: a host lane (a thread instance of a
        ``forward`` handler) or a worker's second pair of arenas (every worker process)."""
        ...

    def stage_soon(self, batch: list[Request], traced: bool = True) -> asyncio.Future[Staged]:
        """Stage ``batch`` ahead (only when ``stager`` is set), while another computes;
        ``traced``: its batch may be traced (the node traces), so its handler's spans
        are recorded, to be put under that batch's span when it runs."""
        ...

    def run_staged_soon(
        self, staged: Staged, trace: TraceParent | None = None
    ) -> asyncio.Future[Ran]:
        """Run a batch staged ahead, from the event loop, as ``run_soon`` runs one."""
        ...

    def run_staged(self, staged: Staged, trace: TraceParent | None = None) -> Ran: ...

    def close(self) -> None: ...

    def abandon(self) -> None: ...


def _closed(batch: list[Request]) -> Sequence[Any]:
    """A closed instance's handler (the run methods raise ``Instance.stopped`` first)."""
    raise RuntimeError("instance is closed")


class _Fetches:
    """What materialising one version took: which blobs came from the store."""

    def __init__(self) -> None:
        self.fetched = 0
        self.fetch_s = 0.0
        self.verify_s = 0.0
        self.pinned: list[str] = []


class InstanceLoader:
    """Materialises versions from a :class:`Repository` and loads their handlers.

    Blobs of a store on this disk are used where they lie; blobs of a remote
    store go through the L2 :class:`BlobCache` (fetched once, verified, pinned
    while an instance uses them).
    """

    def __init__(
        self,
        repository: Repository,
        cache_dir: Path,
        device: Device,
        blob_cache: BlobCache | None = None,
    ) -> None:
        self.repository = repository
        self.cache_dir = cache_dir
        self.device = device
        self.blob_cache = blob_cache
        self.verifier = Verifier(Path(cache_dir) / "verified")  # blobs of a folder store
        self.environments = Environments(Path(cache_dir) / "envs")  # [environment] builds
        #: workers started ahead for process isolation (None: each cold start starts one)
        self.spares: SpareWorkers | None = None
        #: the node's GPUs when it has several to choose from (None: ``device`` alone)
        self.placement: Placement | None = None
        #: watches the files loaded instances map (None: nothing watches them)
        self.scrubber: Scrubber | None = None
        #: what a version never loaded in a worker expects its worker to hold besides
        #: its model (its interpreter and imports): the largest of ``worker_sizes``
        self.worker_bytes = 0
        #: the figures workers count of their own memory (``launch.steady_bytes``): a
        #: worker measuring within an eighth of one counts it; the last used last
        self.worker_sizes: list[int] = []
        self.worker_sizes_lock = threading.Lock()
        #: each code bundle's files and their xxh3, read from it once (``code_dir``)
        self._bundle_files: dict[str, dict[str, str]] = {}

    def _blob_path(self, ref: FileRef, fetches: _Fetches | None = None) -> Path:
        local = self.repository.blob_path(ref.digest)
        if local is not None:
            started = time.perf_counter()
            self.verifier.check(local, ref.digest)  # read in place: checked at every load
            if fetches is not None:
                fetches.verify_s += time.perf_counter() - started
            return local
        if self.blob_cache is None:
            raise BlobNotFound(ref.digest)
        result = self.blob_cache.get(
            ref.digest,
            lambda tmp, written: self.repository.download_blob(ref.digest, tmp, written),
            size_hint=ref.size_bytes,
        )
        if fetches is not None:
            fetches.fetched += result.fetched
            fetches.fetch_s += result.fetch_s
            fetches.verify_s += result.verify_s
            self.blob_cache.pin(ref.digest)
            fetches.pinned.append(ref.digest)
        return result.path

    def mapped_files(self, vm: VersionManifest) -> list[Mapped]:
        """The blobs of ``vm``'s artifacts as verified at its load (their records): what
        its instances map, for the scrub to watch. Call it after a load (blocking)."""
        found = []
        for ref in vm.artifacts.values():
            for file in ref.files:
                local = self.repository.blob_path(file.digest)
                if local is not None:
                    path, record = local, self.verifier.root / file.digest
                elif self.blob_cache is not None:
                    path = self.blob_cache.path(file.digest)
                    record = path.with_suffix(".ok")
                else:
                    continue
                known = read_record(record)
                if known is None:  # verified without a record (an older cache): now
                    try:
                        known = Record(identity(path), quick_digest(path))
                    except FileNotFoundError:  # removed since it was listed: as one
                        continue  # gone before, skipped (nothing recreates it here)
                found.append(Mapped(path, file.digest, known.identity, known.xxh3))
        return found

    def watch_files(self, vm: VersionManifest) -> Watch | None:
        """Watch the files an instance of ``vm`` maps (after its load; blocking), or None
        when nothing watches them (no scrubber)."""
        if self.scrubber is None:
            return None
        return self.scrubber.watch(self.mapped_files(vm))

    def unpin(self, digests: list[str]) -> None:
        if self.blob_cache is not None:
            for digest in digests:
                self.blob_cache.unpin(digest)

    def code_dir(self, vm: VersionManifest, fetches: _Fetches | None = None) -> Path:
        """The version's code, unpacked once per bundle digest (atomically), and checked
        against its bundle at every load: a tree changed since is unpacked again. What
        the bundle holds is read from it once in this process; an intact tree needs
        nothing more (nor a fetch of a bundle the disk cache dropped)."""
        digest = vm.bundle.digest
        dest = self.cache_dir / "code" / digest
        known = self._bundle_files.get(digest)
        if known is not None and dest.is_dir() and not tree_differences(dest, known):
            return dest
        bundle = self._blob_path(vm.bundle, fetches).read_bytes()
        files = None
        if dest.is_dir():
            files = bundle_files(bundle)
            changed = tree_differences(dest, files)
            if changed:
                log.warning(
                    "code of %s changed in the cache (%s): unpacking it again",
                    vm.version,
                    ", ".join(changed[:5]),
                )
                shutil.rmtree(dest, ignore_errors=True)
        dest = _materialise(dest, lambda tmp: _unpack_compiled(bundle, tmp))  # checks it first
        self._bundle_files[digest] = files if files is not None else bundle_files(bundle)
        return dest

    def artifact_path(self, ref: ArtifactRef, fetches: _Fetches | None = None) -> Path:
        """A local path for an artifact: the blob itself, or a folder of links to blobs."""
        if not ref.is_dir:
            return self._blob_path(ref.files[0], fetches)
        targets = [(f.rel, self._blob_path(f, fetches)) for f in ref.files]

        def link_all(tmp: Path) -> None:
            for rel, target in targets:
                link = tmp / check_rel(rel)  # again here: a stored manifest may be old
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(target)

        return _materialise(self.cache_dir / "trees" / ref.digest, link_all)

    def prefetch(self, vm: VersionManifest) -> None:
        """Bring the version's code and artifacts into the disk cache (L2), load nothing:
        a pre-warm that memory does not allow in L1. Blocking."""
        self.code_dir(vm)
        for ref in vm.artifacts.values():
            self.artifact_path(ref)

    def handler_object(self, vm: VersionManifest, fetches: _Fetches | None = None) -> object:
        """Import the version's handler and check its contract (deploy-time validation)."""
        code = self.code_dir(vm, fetches)
        return import_handler(code, vm.manifest, bundle_package(vm.bundle.digest))

    def prepare(
        self, vm: VersionManifest, environment: Callable[[], Environment | None] | None = None
    ) -> Prepared:
        """What a load of ``vm`` needs that holds none of the node's memory, readied
        (blocking): its ``environment`` (a worker's, built here on first use) and its
        files, fetched, checked and pinned. A store or a build that fails raises here,
        before any room is made for the load."""
        started = time.perf_counter()
        built, environment_s = None, None
        if environment is not None:
            built = environment()
            environment_s = time.perf_counter() - started
        files = self.materialise(vm)
        return Prepared(files, built, started, environment_s, time.perf_counter())

    def materialise(self, vm: VersionManifest) -> Materialised:
        """The version's code and artifacts on local disk, their blobs pinned (blocking)."""
        fetches = _Fetches()
        start = time.perf_counter()
        try:
            artifacts = {
                key: LocalArtifact(
                    key, self.artifact_path(ref, fetches), ref.digest, ref.size_bytes, self.device
                )
                for key, ref in vm.artifacts.items()
            }
            code = self.code_dir(vm, fetches)
        except BaseException:
            self.unpin(fetches.pinned)
            raise
        return Materialised(
            code,
            artifacts,
            list(fetches.pinned),
            LoadTier.L3 if fetches.fetched else LoadTier.L2,
            {
                "fetch_s": fetches.fetch_s,
                "verify_s": fetches.verify_s,
                "materialise_s": time.perf_counter() - start,
            },
        )

    def load(
        self, vm: VersionManifest, executor: Executor, prepared: Prepared | None = None
    ) -> Instance:
        """Build an instance in this process; call this on ``executor``'s thread, from
        what :meth:`prepare` readied (now when None); the instance owns its pins.

        ``timings_s`` gets files_s (fetch_s, L3 downloads, and verify_s, hashing, are
        parts of it), room_s (the wait since it was prepared), import_s, load_s (the
        handler's ``load``, mapping weights included), after_s and total_s.
        """
        if prepared is None:
            prepared = self.prepare(vm)
        files = prepared.files
        start = time.perf_counter()
        device = self.device_for(vm)
        artifacts = files.artifacts
        if device != self.device:  # placed on another of the node's GPUs
            artifacts = {k: replace(a, device=device) for k, a in artifacts.items()}
        try:
            built = build_handler(vm, files.code_dir, artifacts, device, map_ahead=map_ahead_now())
        except BaseException:
            self.unpin(files.pinned)
            raise
        finally:
            self.placed(device, vm)
        pinned = files.pinned
        unload = built.unload

        def release() -> None:
            if unload is not None:
                unload()
            self.unpin(pinned)

        done = time.perf_counter()
        timings = {
            **prepared.timings_s(start),
            "import_s": built.import_s,
            "load_s": built.load_s,
            # the rest: the device chosen, the instance's lanes, its size measured
            "after_s": max(done - start - built.import_s - built.load_s, 0.0),
            "total_s": done - prepared.started,
        }
        return Instance(
            vm,
            built.call,
            executor,
            release,
            timings,
            built.size_bytes,
            files.tier,
            built.stepper,
            built.stager,
            built.device_bytes,
            device,
        )

    def device_for(self, vm: VersionManifest) -> Device:
        """The device a new instance of ``vm`` goes to: the GPU with the most free budget
        when the node has several (``placement``), else the node's one device. Counted
        there until :meth:`placed`."""
        if self.placement is None:
            return self.device
        return self.placement.choose(vm.size_bytes)

    def placed(self, device: Device, vm: VersionManifest) -> None:
        """The load :meth:`device_for` placed has ended (its instance counts now, if any)."""
        if self.placement is not None:
            self.placement.placed(device, vm.size_bytes)


@dataclass(frozen=True)
class Materialised:
    """A version's files on this machine: what a handler's ``load`` is given."""

    code_dir: Path
    artifacts: dict[str, LocalArtifact]
    pinned: list[str]  # blobs pinned in the disk cache while an instance uses them
    tier: LoadTier
    timings_s: dict[str, float]


@dataclass(frozen=True)
class Prepared:
    """What a load readied before it took any of the node's memory
    (:meth:`InstanceLoader.prepare`): its files, pinned, and a worker's
    ``[environment]``. A load made from it owns the pins; one never made gives them
    back (:meth:`InstanceLoader.unpin`). Times are ``time.perf_counter``'s."""

    files: Materialised
    environment: Environment | None
    started: float  # when preparing began: the cold start counts from here
    environment_s: float | None  # None: a thread's load, which readies none
    ready: float  # when it was ready

    def timings_s(self, load_started: float) -> dict[str, float]:
        """The cold start's first stages, for a load that started at ``load_started``:
        the environment, the files, and the wait between (``room_s``: room made in the
        node's memory for it)."""
        environment_s = self.environment_s or 0.0
        timings = {} if self.environment_s is None else {"environment_s": environment_s}
        timings["files_s"] = self.ready - self.started - environment_s
        timings["fetch_s"] = self.files.timings_s["fetch_s"]
        timings["verify_s"] = self.files.timings_s["verify_s"]
        timings["room_s"] = max(load_started - self.ready, 0.0)
        return timings


@dataclass(frozen=True)
class Built:
    """A handler imported and loaded: what to call per batch and at unload."""

    call: Callable[[list[Request]], Sequence[Any]]
    unload: Callable[[], None] | None
    size_bytes: int
    import_s: float
    load_s: float
    stepper: Stepper | None = None  # a generative handler's (``call`` then refuses)
    stager: Stager | None = None  # a handler with forward(): ``call`` stages and computes
    device_bytes: int = 0  # what it holds in device memory (``size_bytes``: in host memory)


def build_handler(
    vm: VersionManifest,
    code_dir: Path,
    artifacts: Mapping[str, LocalArtifact],
    device: Device,
    *,
    map_ahead: bool = False,
) -> Built:
    """Import the version's handler from ``code_dir`` and run its ``load`` (blocking;
    in a worker process this runs in the worker). With ``map_ahead`` (a cold start
    when a core is idle: :func:`map_ahead_now`), on the CPU, its safetensors artifacts
    are mapped first and their page tables filled meanwhile on a thread of their own
    (``MappedAhead``), for its ``tensors()`` to take: its first batch then takes no
    page faults on the weights."""
    ahead = None
    if map_ahead and device.kind == "cpu":
        ahead = MappedAhead(a.path for a in artifacts.values())
    try:
        return _build_handler(vm, code_dir, artifacts, device)
    finally:
        if ahead is not None:
            ahead.close()  # what the handler did not take is unmapped


def map_ahead_now() -> bool:
    """Whether a load starting now maps its weights ahead (a core is idle to fill them)."""
    return safetensors_format.core_idle()


def _build_handler(
    vm: VersionManifest, code_dir: Path, artifacts: Mapping[str, LocalArtifact], device: Device
) -> Built:
    mark = time.perf_counter()
    obj = import_handler(code_dir, vm.manifest, bundle_package(vm.bundle.digest))
    import_s = time.perf_counter() - mark
    mark = time.perf_counter()
    handler = obj() if inspect.isclass(obj) else obj  # a class is instantiated once
    staged = inspect.isclass(obj) and defines_forward(obj) and not vm.manifest.generative
    if staged:  # before anything is loaded: a forward handler needs torch
        require("torch", "a handler with forward()")
    lanes = lanes_for(device) if device.kind == "cuda" or staged else None
    if lanes is not None:  # the handler sees its instance's own compute stream
        device = replace(device, stream=lanes.compute.handle)
    try:
        return _built(vm, obj, handler, artifacts, device, lanes, staged, import_s, mark)
    except BaseException:
        if lanes is not None:  # a load that failed gives its streams back
            lanes.close()
        raise


def _built(
    vm: VersionManifest,
    obj: object,
    handler: Any,
    artifacts: Mapping[str, LocalArtifact],
    device: Device,
    lanes: Lanes | None,
    staged: bool,
    import_s: float,
    mark: float,
) -> Built:
    """``build_handler`` once the instance's lanes are made: load, then what to call."""
    unload: Callable[[], None] | None = None
    generative = vm.manifest.generative
    per_batch = handler if handler is obj or not callable(handler) else type(handler).__call__
    hooks = [per_batch, getattr(handler, "load", None), getattr(handler, "unload", None)]
    if generative:
        hooks += [getattr(handler, m, None) for m in ("start", "step", "stop")]
    loop = asyncio.new_event_loop() if any(map(inspect.iscoroutinefunction, hooks)) else None
    if handler is not obj:
        load = getattr(handler, "load", None)
        if load is not None:
            try:
                on_stream(device, _run)(loop, load, artifacts, device)
            except BaseException:
                if loop is not None:  # no instance will close it: its descriptors now
                    loop.close()
                raise
        unload = getattr(handler, "unload", None)
        if loop is not None and unload is not None:  # awaited there, before what follows
            unload = functools.partial(_run, loop, unload)  # it (a stager's, lanes') closes
    if lanes is not None and lanes.on_gpu:  # cuBLAS's workspace: counted, not a batch's
        on_stream(device, warm_libraries)(device)
    load_s = time.perf_counter() - mark
    size, device_size = held(handler)
    if not size + device_size:  # an onnxruntime session hides its tensors: the weights' size
        size, device_size = (0, vm.size_bytes) if device.kind == "cuda" else (vm.size_bytes, 0)
    if lanes is not None:
        unload = _releasing(lanes, device, unload)
    if generative:
        stepper = Stepper(handler, vm, functools.partial(on_stream(device, _run), loop))
        unload = _closing(stepper, unload)
        if loop is not None:
            unload = _closing_loop(loop, unload)
        return Built(_not_batched, unload, size, import_s, load_s, stepper, None, device_size)
    if staged:
        assert lanes is not None
        stager = Stager(cast(Any, handler).forward, vm.manifest.inputs, vm.manifest.outputs, lanes)
        unload = _closing_stager(stager, unload)
        if loop is not None:  # the loop of its async load and unload closes with it
            unload = _closing_loop(loop, unload)
        return Built(stager.run, unload, size, import_s, load_s, None, stager, device_size)
    call = cast(Callable[[list[Request]], Sequence[Any]], handler)
    if loop is not None:  # async hooks run on the instance's own loop, on its thread
        call, unload = _on_loop(loop, call, unload)
    if device.stream:
        call = on_stream(device, call)
    return Built(call, unload, size, import_s, load_s, device_bytes=device_size)


def on_stream(device: Device, fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` run with the instance's compute stream as torch's current stream, and that
    stream drained before it returns (fnrt's streams do not wait on the default stream,
    nor it on them). Unchanged on the CPU, or where the handler does not use torch."""
    if not device.stream:
        return fn

    made: list[Any] = []  # the torch stream, made at the first call (torch is loaded then)

    def run(*args: Any) -> T:
        torch = sys.modules.get("torch")
        if torch is None:  # onnxruntime alone: its CUDA provider has the stream
            return fn(*args)
        if not made:
            made.append(device.torch_stream)
        stream = made[0]
        with torch.cuda.stream(stream):
            result = fn(*args)
        stream.synchronize()
        return result

    return run


def _releasing(lanes: Lanes, device: Device, unload: Callable[[], Any] | None) -> Callable[[], Any]:
    """``unload`` on the instance's stream, then its streams given back. (The GPU memory
    its tensors held goes back to the device once the instance is dropped: a worker
    exits; a thread instance's is emptied from torch's cache by the pool's release.)"""

    def release() -> Any:
        try:
            return on_stream(device, unload)() if unload is not None else None
        finally:
            lanes.close()

    return release


def _closing_stager(stager: Stager, unload: Callable[[], Any] | None) -> Callable[[], Any]:
    def close() -> Any:
        try:
            return unload() if unload is not None else None
        finally:
            stager.close()

    return close


def _not_batched(batch: list[Request]) -> Sequence[Any]:
    raise RuntimeError("a generative function's instance is driven step by step")


def _closing(stepper: Stepper, unload: Callable[[], Any] | None) -> Callable[[], Any]:
    """``unload`` after letting the stepper's active sequences go."""

    def close() -> Any:
        stepper.close()
        return unload() if unload is not None else None

    return close


def _run(loop: asyncio.AbstractEventLoop | None, fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn``; a coroutine it returns runs to completion on ``loop``."""
    result = fn(*args)
    if inspect.iscoroutine(result):
        assert loop is not None, "a coroutine from a handler that declared no async hook"
        return loop.run_until_complete(result)
    return result


def _on_loop(
    loop: asyncio.AbstractEventLoop,
    call: Callable[[list[Request]], Any],
    unload: Callable[[], Any] | None,
) -> tuple[Callable[[list[Request]], Sequence[Any]], Callable[[], None]]:
    """An async handler's batch call and unload as blocking calls on ``loop`` (one per
    instance: batches of an instance run one at a time, on its executor's thread)."""

    def run_batch(batch: list[Request]) -> Sequence[Any]:
        return cast(Sequence[Any], _run(loop, call, batch))

    return run_batch, _closing_loop(loop, unload)


def _closing_loop(
    loop: asyncio.AbstractEventLoop, unload: Callable[[], Any] | None
) -> Callable[[], None]:
    """``unload`` (a coroutine it returns run on ``loop``), then ``loop`` closed."""

    def close() -> None:
        try:
            if unload is not None:
                _run(loop, unload)
        finally:
            loop.close()

    return close


def _materialise(dest: Path, fill: Callable[[Path], None]) -> Path:
    """``dest``, a folder made once: filled under a temporary name, then renamed into place.

    Concurrent makers (threads or processes) each fill their own temporary
    folder; the first rename wins and the others find ``dest`` there.
    """
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".fill-"))
    try:
        fill(tmp)
        os.replace(tmp, dest)
    except OSError:
        if not dest.is_dir():  # another maker won the race only if dest exists
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _unpack_compiled(bundle: bytes, dest: Path) -> None:
    """Unpack a code bundle and compile its modules (bytecode checked against each
    source's hash), so that every worker imports them compiled, also where
    ``PYTHONDONTWRITEBYTECODE`` is set, as in many container images: about 0.4 ms of a
    cold start of the benchmark's two small modules. A module that does not compile is
    left to its import, which says why."""
    unpack_code(bundle, dest)
    compileall.compile_dir(
        dest, quiet=2, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH
    )


def held_bytes(root: object, max_objects: int = 200_000) -> int:
    """Bytes of the numpy arrays and torch tensors reachable from ``root``'s attributes,
    in host and device memory together (:func:`held`)."""
    host, device = held(root, max_objects)
    return host + device


def held(root: object, max_objects: int = 200_000) -> tuple[int, int]:
    """Bytes of the numpy arrays and torch tensors reachable from ``root``'s attributes:
    (in host memory, in device memory).

    Each buffer counts once however many views share it (numpy bases, torch
    storages). Mapped weights count too: they are what the instance keeps resident.
    """
    torch = sys.modules.get("torch")
    module_type = torch.nn.Module if torch is not None else None
    seen: set[int] = set()
    buffers: dict[int, int] = {}
    on_device: set[int] = set()
    stack: list[object] = [root]
    while stack and len(seen) < max_objects:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, str | bytes | int | float | bool | type(None)):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            base = obj
            while isinstance(base.base, np.ndarray):
                base = base.base
            buffers[id(base)] = max(buffers.get(id(base), 0), base.nbytes)
        elif hasattr(obj, "untyped_storage") and type(obj).__module__.startswith("torch"):
            storage = obj.untyped_storage()
            buffers[storage.data_ptr()] = storage.nbytes()
            if storage.device.type != "cpu":
                on_device.add(storage.data_ptr())
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif module_type is not None and isinstance(obj, module_type):
            stack.extend(_module_parts(obj, module_type))
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            stack.extend(vars(obj).values())
    device = sum(n for key, n in buffers.items() if key in on_device)
    return sum(buffers.values()) - device, device


def _module_parts(module: Any, module_type: type) -> list[object]:
    """What :func:`held` follows from a torch module: its parameters, buffers and
    submodules, and the attributes its own class gave it; not the dozen hook tables
    every module carries (a model of many layers would make that most of the walk)."""
    bookkeeping = _module_bookkeeping(module_type)
    parts = [v for k, v in vars(module).items() if k not in bookkeeping]
    parts += module._parameters.values()
    parts += module._buffers.values()
    parts += module._modules.values()
    return parts


@functools.cache
def _module_bookkeeping(module_type: type) -> frozenset[str]:
    """The attributes ``torch.nn.Module.__init__`` gives every module."""
    return frozenset(vars(module_type()))
