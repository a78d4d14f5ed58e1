"""The gateway alone: no server. Its real neighbours: a registry on a folder store, the
schedulers it makes (a small handler in a thread), split tails, a manual clock; the
keep-alive keeper is a small fake (it only counts). That every HTTP data route goes
through the gateway is ``tests/runtime/http/test_guarded_routes.py``'s."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from fnrt.functions.errors import CircuitOpen, Overloaded, VersionRetired
from fnrt.functions.handler import Request
from fnrt.functions.manifest import IsolationMode
from fnrt.loader.device import detect_device
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.repository import Repository
from fnrt.loader.stores import FileStore
from fnrt.runtime import scheduler as sched
from fnrt.runtime.clock import ManualClock
from fnrt.runtime.deployment import cut_over, store_version
from fnrt.runtime.events import NoEvents
from fnrt.runtime.gateway import Gateway, Target
from fnrt.runtime.intake import Admission
from fnrt.runtime.protection import Served
from fnrt.runtime.registry import Registry
from fnrt.runtime.scheduler import Scheduler, SchedulerFactory
from fnrt.runtime.split import Splits
from support import ECHO_MANIFEST, publish, write_function

NAME = "echo"
X = {"x": np.ones((1, 4), np.float32)}


class Counted:
    """The keeper as the keep-alive guard sees it: it is told of each call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def invoked(self, name: str) -> None:
        self.calls.append(name)


@dataclass
class Parts:
    gateway: Gateway
    registry: Registry
    clock: ManualClock
    admission: Admission
    loader: InstanceLoader
    tmp: Path
    version: str  # the version routed first


async def _parts(tmp_path: Path, extra: str = "", keeper: Counted | None = None) -> Parts:
    repository = Repository(FileStore(tmp_path / "store"))
    loader = InstanceLoader(repository, tmp_path / "cache", detect_device("cpu"))
    clock, admission = ManualClock(), Admission(100)
    factory = SchedulerFactory(loader, clock, NoEvents(), admission, isolation=IsolationMode.THREAD)
    registry = Registry(repository, factory, clock)
    gateway = Gateway(registry, Splits(registry, loader, factory), clock, keeper)
    parts = Parts(gateway, registry, clock, admission, loader, tmp_path, "")
    parts.version = await _deploy(parts, extra)
    return parts


async def _deploy(parts: Parts, extra: str, name: str = NAME) -> str:
    """Store a version of the echo function ``name`` (``extra`` appended to its
    manifest) and route all traffic to it; its id."""
    repository = parts.registry.repository
    folder = write_function(parts.tmp / "src", name, manifest=_batching_no_wait(extra))
    vm = publish(repository, folder)
    _, vm = await asyncio.to_thread(store_version, repository, parts.loader, vm)
    await asyncio.to_thread(cut_over, repository, vm)
    return vm.version


def _batching_no_wait(extra: str) -> str:
    """The echo manifest with batches leaving at once (the clock is a manual one)."""
    size = "max_batch_size = {max_batch_size}\n"
    return ECHO_MANIFEST.replace(size, size + "max_wait_ms = 0\n") + extra


def _run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


async def _invoke(parts: Parts, inputs: Request = X) -> Served:
    gateway = parts.gateway
    scheduler = await gateway.choose(Target(NAME))
    return await gateway.submit(gateway.call(scheduler, inputs))


async def _open_breaker(parts: Parts) -> Scheduler:
    """The echo function's breaker opened by three server-side failures (over its error
    rate); its scheduler."""
    scheduler = await parts.gateway.choose(Target(NAME))
    for _ in range(3):
        scheduler.protection.breaker.record(parts.clock.now(), True)
    return scheduler


def test_a_function_served_here_is_chosen_without_a_wait(tmp_path: Path) -> None:
    async def scenario() -> None:
        parts = await _parts(tmp_path)
        gateway = parts.gateway
        assert gateway.choose_now(Target(NAME)) is None  # not read from the store yet
        chosen = await gateway.choose(Target(NAME))
        assert chosen.version.version == parts.version
        assert gateway.choose_now(Target(NAME)) is chosen  # the usual request: no wait
        pinned = Target(NAME, version=parts.version)
        assert gateway.choose_now(pinned) is None  # a pinned version is looked up
        assert await gateway.choose(pinned) is chosen
        newer = await _deploy(parts, "\n# the next version\n")
        await parts.registry.refresh(await parts.registry.entry(NAME))
        assert (await gateway.choose(Target(NAME))).version.version == newer
        assert await gateway.choose(pinned) is chosen  # pinned: whatever the routing says
        await parts.registry.close()

    _run(scenario)


def test_the_call_is_one_counted_record_with_the_versions_deadline(tmp_path: Path) -> None:
    async def scenario() -> None:
        parts = await _parts(tmp_path)
        gateway, clock = parts.gateway, parts.clock
        scheduler = await gateway.choose(Target(NAME))
        call = gateway.call(scheduler, X, timeout_s=2.0)
        assert call.counted and call.scheduler is scheduler and call.inputs is X
        assert call.enqueued_at == clock.now() and call.deadline == clock.now() + 2.0
        served = await gateway.submit(call)
        np.testing.assert_array_equal(served.outputs["y"], X["x"] * 2)
        assert scheduler.stats.requests == 1
        await parts.registry.close()

    _run(scenario)


def test_the_result_cache_answers_a_repeat_before_the_queue(tmp_path: Path) -> None:
    async def scenario() -> None:
        parts = await _parts(tmp_path, "\n[result_cache]\nenabled = true\n")
        first = await _invoke(parts)
        second = await _invoke(parts)
        assert not first.cached and second.cached
        scheduler = await parts.gateway.choose(Target(NAME))
        assert scheduler.stats.requests == 1  # the hit never reached the queue
        assert scheduler.stats.totals.cache_hit.count == 1
        await parts.registry.close()

    _run(scenario)


def test_an_open_breaker_refuses_with_a_retry_after(tmp_path: Path) -> None:
    async def scenario() -> None:
        parts = await _parts(tmp_path, "\n[breaker]\nmin_requests = 1\nopen_s = 60\n")
        await _invoke(parts)
        scheduler = await _open_breaker(parts)
        with pytest.raises(CircuitOpen, match="circuit breaker is open") as refused:
            await _invoke(parts)
        assert refused.value.retry_after_s is not None and refused.value.retry_after_s >= 1
        assert scheduler.stats.requests == 1
        parts.clock.advance(61)  # open_s passed: one probe may go through
        await _invoke(parts)
        assert scheduler.stats.requests == 2
        await parts.registry.close()

    _run(scenario)


def test_the_node_wide_admission_bound_refuses_at_submit(tmp_path: Path) -> None:
    async def scenario() -> None:
        parts = await _parts(tmp_path)
        gateway = parts.gateway
        scheduler = await gateway.choose(Target(NAME))
        parts.admission.max_queued = 0  # nothing may queue now
        with pytest.raises(Overloaded, match="the server has 0 requests queued"):
            gateway.submit(gateway.call(scheduler, X))  # raised at once, not awaited
        parts.admission.max_queued = 10
        await _invoke(parts)
        await parts.registry.close()

    _run(scenario)


def test_every_call_counts_for_keep_alive(tmp_path: Path) -> None:
    async def scenario() -> None:
        keeper = Counted()
        parts = await _parts(tmp_path, keeper=keeper)
        for _ in range(3):
            await _invoke(parts)
        assert keeper.calls == [NAME] * 3
        await parts.registry.close()

    _run(scenario)


def test_a_retired_version_hands_its_request_to_its_successor(tmp_path: Path) -> None:
    async def scenario() -> None:
        parts = await _parts(tmp_path)
        gateway, registry = parts.gateway, parts.registry
        stale = await gateway.choose(Target(NAME))
        await sched.close(stale)  # it retired after a request chose it
        with pytest.raises(VersionRetired):
            gateway.submit(gateway.call(stale, X))
        with pytest.raises(VersionRetired):  # nothing replaced it yet
            await gateway.successor(Target(NAME), stale)
        entry = await registry.entry(NAME)
        registry.hold(entry, parts.version, registry.new_scheduler(stale.version))
        successor = await gateway.successor(Target(NAME), stale)
        assert successor is not stale and successor.version.version == parts.version
        await gateway.submit(gateway.call(successor, X))
        pinned = Target(NAME, version=parts.version)
        with pytest.raises(VersionRetired):  # a pinned request has no successor
            await gateway.successor(pinned, stale)
        await registry.close()

    _run(scenario)


def test_an_open_breaker_answers_from_the_last_results_for_the_same_inputs(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        parts = await _parts(
            tmp_path, '\n[breaker]\nmin_requests = 1\nopen_s = 60\nfallback = "cache"\n'
        )
        before = await _invoke(parts)
        scheduler = await _open_breaker(parts)
        again = await _invoke(parts)
        assert again.cached and again.fallback == "cache"
        np.testing.assert_array_equal(again.outputs["y"], before.outputs["y"])
        with pytest.raises(CircuitOpen):  # inputs it has no result for
            await _invoke(parts, {"x": np.zeros((1, 4), np.float32)})
        assert scheduler.stats.requests == 1
        await parts.registry.close()

    _run(scenario)


def test_an_open_breaker_hands_the_call_to_its_fallback_function(tmp_path: Path) -> None:
    async def scenario() -> None:
        fallback = '\n[breaker]\nmin_requests = 1\nopen_s = 60\nfallback = "function:backup"\n'
        parts = await _parts(tmp_path, fallback)
        await _deploy(parts, "", name="backup")
        await _invoke(parts)
        scheduler = await _open_breaker(parts)
        served = await _invoke(parts)
        assert served.fallback == "function:backup"
        np.testing.assert_array_equal(served.outputs["y"], X["x"] * 2)
        backup = await parts.gateway.choose(Target("backup"))
        assert scheduler.stats.requests == 1 and backup.stats.requests == 1
        await parts.registry.close()

    _run(scenario)
