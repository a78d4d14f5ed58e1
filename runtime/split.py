"""Split inference on this node: a version's cuts, its tails' schedulers, its profile.

An edge device runs the head of a split-capable function (its manifest's
``[split]``) and sends the activation at split ``k``; the tail for ``k`` runs
here through its own :class:`Scheduler` (queue, batching, scale to zero), so
tails of the same ``k`` share batches. The edge client plans from
:meth:`Splits.plan`: the split points, the heads' digests, and this node's
time per segment (measured once per version) plus its current queue wait.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fnrt.edge.cut import Cuts, Point, digest_of
from fnrt.functions.dtypes import numpy_dtype
from fnrt.functions.errors import DeployRejected, FnrtError, InvalidInput, NoSuchSplit
from fnrt.functions.handler import Request
from fnrt.functions.version import VersionManifest
from fnrt.loader.formats import onnx as onnx_format
from fnrt.loader.instance import Instance, InstanceLoader, LoadTier
from fnrt.runtime import scheduler as sched
from fnrt.runtime.scheduler import Scheduler, SchedulerFactory

log = logging.getLogger("fnrt.split")

#: Runs of each tail when a version's server profile is measured (after one warm-up).
PROFILE_RUNS = 7
#: The one input of a split request, as its route decodes it: the activation at split k.
ACTIVATION = "activation"


class Versions(Protocol):
    """What splits need of the function table (the registry)."""

    async def version_manifest(
        self, name: str, version: str | None = None, *, fresh: bool = True
    ) -> VersionManifest:
        """The routed version of ``name`` (None), or the stored version ``version``
        (``fresh``: read from the store whatever it said of it a moment ago)."""
        ...

    def versions_of(self, name: str) -> list[Scheduler]: ...


@dataclass(frozen=True)
class Head:
    """A head artifact the device downloads: the model up to split ``k``."""

    k: int
    path: Path
    digest: str
    size_bytes: int


@dataclass(frozen=True)
class SplitVersion:
    """One version's cuts, heads and server time per segment."""

    vm: VersionManifest
    cuts: Cuts
    heads: Mapping[int, Head]
    tail_ms: tuple[float, ...]  # the whole tail from split k (k = 0 .. n), batch of one

    @property
    def segment_ms(self) -> list[float]:
        """Time of each segment here: segment i runs from split i to split i + 1."""
        tails = [*self.tail_ms, 0.0]
        return [round(max(tails[i] - tails[i + 1], 0.0), 4) for i in range(len(self.tail_ms))]


class Splits:
    """The split side of every function this node serves."""

    def __init__(
        self, versions: Versions, loader: InstanceLoader, schedulers: SchedulerFactory
    ) -> None:
        self._table = versions
        self._loader = loader
        self._schedulers = schedulers
        self._versions: dict[tuple[str, str], asyncio.Future[SplitVersion]] = {}
        self._tails: dict[tuple[str, str, int], Scheduler] = {}

    # --- what the device asks ------------------------------------------------------------

    async def plan(self, name: str, version: str | None = None) -> dict[str, Any]:
        """What an edge client plans with (``GET /v1/functions/{name}/split``)."""
        split = await self.version(name, version)
        cuts, vm = split.cuts, split.vm
        queued = self._wait_ms(name, vm.version)
        return {
            "function": name,
            "version": vm.version,
            "inputs": [p.to_dict() for p in cuts.input_points],
            "outputs": list(cuts.outputs),
            "output_row_bytes": sum(
                _row_bytes(spec.dtype, spec.shape) for spec in vm.manifest.outputs.values()
            ),
            "points": [p.to_dict() for p in cuts.points],
            "splits": cuts.count,
            "heads": [
                {"k": h.k, "digest": h.digest, "size_bytes": h.size_bytes}
                for h in split.heads.values()
            ],
            "server_ms": split.segment_ms,
            "server_wait_ms": round(queued, 3),
        }

    async def head(self, name: str, k: int, version: str | None = None) -> Head:
        split = await self.version(name, version)
        if k not in split.heads:
            raise NoSuchSplit(name, f"split {k} has no head (1 to {split.cuts.count - 1})")
        return split.heads[k]

    async def tail(self, name: str, k: int, version: str | None = None) -> Scheduler:
        """The scheduler of split ``k``'s tail (of ``version``, or the routed one)."""
        split = await self.version(name, version)
        cuts = split.cuts
        if not 0 <= k < cuts.count - 1:
            raise NoSuchSplit(name, f"split {k} has no tail here (0 to {cuts.count - 2})")
        if k == 0 and len(cuts.input_points) != 1:
            raise NoSuchSplit(name, "split 0 needs a model with one input: use /invoke")
        return self._tail(split, k)

    def tail_inputs(self, vm: VersionManifest, k: int, raw: Request) -> Request:
        """The tail's inputs from a decoded split request (``{ACTIVATION: array}``),
        checked against the split point; InvalidInput if it does not fit."""
        made = self._versions[(vm.name, vm.version)]
        cuts = made.result().cuts
        point = cuts.sent(k) or cuts.input_points[0]
        activation = raw[ACTIVATION]
        _check(point, activation)
        return {point.name: activation}

    # --- versions and tails --------------------------------------------------------------

    async def version(self, name: str, version: str | None = None) -> SplitVersion:
        """The split side of ``version`` (the routed one when None), made once."""
        vm = await self._table.version_manifest(name, version, fresh=False)  # a request's
        if not vm.manifest.split.enabled:
            raise NoSuchSplit(name, "has no split points (see [split] in docs/edge.md)")
        return await self._made(vm)

    async def check(self, vm: VersionManifest) -> None:
        """Cut a version being deployed; DeployRejected if its split points are wrong."""
        try:
            await self._made(vm)
        except FnrtError as exc:
            raise DeployRejected(vm.name, vm.version, f"split: {exc.message}") from None
        except Exception as exc:  # not an ONNX model, say
            reason = f"split: cannot cut {vm.manifest.split.model!r}: {type(exc).__name__}: {exc}"
            raise DeployRejected(vm.name, vm.version, reason) from None

    async def _made(self, vm: VersionManifest) -> SplitVersion:
        key = (vm.name, vm.version)
        made = self._versions.get(key)
        if made is None or (made.done() and made.exception() is not None):
            made = self._versions[key] = asyncio.ensure_future(asyncio.to_thread(self._make, vm))
        return await asyncio.shield(made)

    def _make(self, vm: VersionManifest) -> SplitVersion:
        """Cut the model, digest the heads, time the tails (blocking)."""
        loader = self._loader
        ref = vm.artifacts[vm.manifest.split.model]
        model = loader.artifact_path(ref)
        if model.is_dir():
            found = sorted(model.glob("*.onnx"))
            if len(found) != 1:
                raise FnrtError(f"split.model must hold one .onnx file, found {len(found)}")
            model = found[0]
        cuts = Cuts(model, vm.manifest.split.points, loader.cache_dir / "split" / ref.digest)
        missing = set(vm.manifest.outputs) - set(cuts.outputs)
        if missing:
            raise FnrtError(f"split.model has no outputs {sorted(missing)} the manifest declares")
        heads = {}
        for k in range(1, cuts.count):
            path = cuts.head(k)
            heads[k] = Head(k, path, digest_of(path), path.stat().st_size)
        return SplitVersion(vm, cuts, heads, _profile(cuts, loader.device.onnx_providers))

    def _tail(self, split: SplitVersion, k: int) -> Scheduler:
        vm = split.vm
        key = (vm.name, vm.version, k)
        scheduler = self._tails.get(key)
        if scheduler is None or scheduler.batcher.closing:
            cuts, providers = split.cuts, self._loader.device.onnx_providers

            def load(vm: VersionManifest, executor: Executor) -> Instance:
                return _tail_instance(vm, cuts, k, providers, executor)

            scheduler = self._tails[key] = self._schedulers(vm, load)
        return scheduler

    def _wait_ms(self, name: str, version: str) -> float:
        """The expected queue wait here now: the queued requests of the version's
        schedulers (its own and its tails') times their cost per request."""
        wait = 0.0
        related = [s for (n, v, _), s in self._tails.items() if (n, v) == (name, version)]
        related += [s for s in self._table.versions_of(name) if s.version.version == version]
        for scheduler in related:
            per_item_s, _ = scheduler.batcher.cost.coefficients()
            wait += scheduler.batcher.queued * per_item_s * 1000.0
        return wait

    def schedulers(self) -> list[Scheduler]:
        return list(self._tails.values())

    @property
    def active(self) -> bool:
        """Whether any tail or split version is kept here (else a sweep has nothing to do)."""
        return bool(self._tails or self._versions)

    async def sweep(self, now: float, held: set[tuple[str, str]]) -> list[str]:
        """Scale idle tails to zero; forget versions the node no longer holds once
        their tails are idle and unloaded (a device may still send to one a while)."""
        unloaded = []
        for key, scheduler in list(self._tails.items()):
            if await sched.scale_to_zero(scheduler, now):
                unloaded.append(scheduler.name)
            idle = scheduler.pool.instances == 0 and not scheduler.batcher.queued
            if key[:2] not in held and idle:
                del self._tails[key]
                await sched.close(scheduler)
        active = {tail[:2] for tail in self._tails}
        for version in list(self._versions):
            if version not in held and version not in active:
                del self._versions[version]
        return unloaded

    async def close(self) -> None:
        tails, self._tails = list(self._tails.values()), {}
        await asyncio.gather(*(sched.close(s) for s in tails), return_exceptions=True)


def _check(point: Point, activation: np.ndarray[Any, Any]) -> None:
    if activation.ndim != len(point.row_shape) + 1 or activation.shape[1:] != point.row_shape:
        raise InvalidInput(
            f"activation for {point.name!r} must have shape [n, "
            f"{', '.join(map(str, point.row_shape))}], got {list(activation.shape)}",
            input=point.name,
        )
    if activation.shape[0] < 1:
        raise InvalidInput("activation has no rows", input=point.name)
    # a float point takes any float encoding; any other only its own dtype (token ids
    # cast from floats would be rounded: the wrong numbers, not an error)
    floating = point.dtype.startswith(("float", "bfloat"))
    sent = activation.dtype
    if (sent.kind != "f") if floating else (sent != numpy_dtype(point.dtype)):
        raise InvalidInput(
            f"activation for {point.name!r} must be {point.dtype} (the split point's), got {sent}",
            input=point.name,
        )


def _row_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes of one row of a declared tensor (a dimension of any size counts as 1)."""
    size = 1
    for dim in shape[1:]:
        size *= max(dim, 1)
    return size * (2 if dtype == "bfloat16" else numpy_dtype(dtype).itemsize)


def _tail_instance(
    vm: VersionManifest, cuts: Cuts, k: int, providers: list[Any], executor: Executor
) -> Instance:
    """An instance running the tail of split ``k``: a batch's rows in one session run."""
    started = time.perf_counter()
    session = onnx_format.session(cuts.tail(k), providers)
    point = cuts.sent(k) or cuts.input_points[0]
    declared = vm.manifest.outputs  # the graph may have more: only these are answered
    outputs = [o for o in cuts.outputs if o in declared] if declared else list(cuts.outputs)
    dtype = np.dtype(point.dtype)

    def call(batch: list[Request]) -> list[dict[str, Any]]:
        parts = [np.asarray(r[point.name], dtype=dtype) for r in batch]
        sizes = [len(p) for p in parts]
        ran = session.run(outputs, {point.name: np.concatenate(parts)})
        cuts_at = np.cumsum(sizes)[:-1]
        split = [np.split(out, cuts_at) for out in ran]
        return [{name: split[j][i] for j, name in enumerate(outputs)} for i in range(len(batch))]

    elapsed = time.perf_counter() - started
    size = cuts.tail(k).stat().st_size
    timings = {"fetch_s": 0.0, "verify_s": 0.0, "import_s": 0.0, "load_s": elapsed}
    return Instance(vm, call, executor, None, {**timings, "total_s": elapsed}, size, LoadTier.L2)


def _profile(cuts: Cuts, providers: list[Any]) -> tuple[float, ...]:
    """The median time (ms) of each tail on one row of zeros: k = 0 .. n."""
    out = []
    for k in range(cuts.count - 1):
        sent = cuts.sent(k)  # k = 0: the model's inputs, every one (a device sends one
        # only to a model of one input; the whole model's time still plans the others)
        points = [sent] if sent is not None else list(cuts.input_points)
        session = onnx_format.session(cuts.tail(k), providers)
        feed = {p.name: np.zeros((1, *p.row_shape), dtype=p.dtype) for p in points}
        session.run(None, feed)  # warm-up: first runs allocate
        times = []
        for _ in range(PROFILE_RUNS):
            started = time.perf_counter()
            session.run(None, feed)
            times.append((time.perf_counter() - started) * 1000.0)
        out.append(statistics.median(times))
    log.info("split profile of %s: %s ms", cuts.model_path.name, [round(t, 3) for t in out])
    return tuple(out)
