"""The memory budget: least recently used idle residents go first; busy ones never."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest

from fnrt.loader.memory import Holders, MemoryBudget, device_bytes, room_maker
from support import Held, OnGpu


def _loaded(making: Coroutine[Any, Any, Callable[[], None]]) -> None:
    """Make the room for a load, and the load ends: the room it held is given back."""
    asyncio.run(making)()


def test_make_room_evicts_oldest_idle_first_and_never_busy_ones() -> None:
    held = [Held("a", 400, 1.0), Held("b", 400, 0.5, busy=True), Held("c", 400, 2.0)]
    budget = MemoryBudget(1000, lambda: held)
    assert not budget.fits(300) and budget.fits(-200)
    _loaded(budget.make_room("new", 100))
    assert [h.evicted for h in held] == [True, False, False]  # a was enough
    _loaded(budget.make_room("new", 900))
    assert [h.evicted for h in held] == [True, False, True]  # b is busy: over budget
    assert budget.used_bytes() == 400


def test_the_loading_resident_and_an_unbounded_budget_are_left_alone() -> None:
    held = [Held("a", 900, 1.0)]
    _loaded(MemoryBudget(1000, lambda: held).make_room("a", 500))
    _loaded(MemoryBudget(None, lambda: held).make_room("b", 10**12))
    assert not held[0].evicted


def test_the_gpu_budget_counts_and_evicts_by_device_memory() -> None:
    held = [OnGpu("a", 10, 1.0, device_bytes=600), OnGpu("b", 900, 0.5, device_bytes=0)]
    host = MemoryBudget(1000, lambda: held)
    gpu = MemoryBudget(1000, lambda: held, device_bytes)
    assert gpu.used_bytes() == 600 and host.used_bytes() == 910
    _loaded(room_maker(host, gpu)("new", 50, 500))  # the host fits; the GPU does not
    assert [h.evicted for h in held] == [True, False]  # a, though b is older and bigger
    _loaded(room_maker(host, None)("new", 50, 10**12))  # no GPU: its bytes ask nothing
    assert not held[1].evicted


def test_held_memory_is_told_apart_by_where_it_lies() -> None:
    import numpy as np
    import torch

    from fnrt.loader.instance import held, held_bytes

    class Model:
        def __init__(self) -> None:
            self.w = torch.zeros(1000)  # 4,000 bytes
            self.view = self.w[:10]  # the same storage: counted once
            self.table = {"a": np.zeros(250, np.float64)}  # 2,000 bytes

    assert held(Model()) == (6000, 0)
    assert held_bytes(Model()) == 6000


def test_a_torch_module_counts_its_weights_buffers_and_own_attributes() -> None:
    import numpy as np
    import torch

    from fnrt.loader.instance import held

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.ReLU())  # 440 B
            self.register_buffer("scale", torch.ones(25))  # 100 bytes
            self.vocab = {"table": np.zeros(100, np.uint8)}  # 100 bytes, an attribute of its own
            self.tied = self.layers[0].weight  # the same storage: counted once

    net = Net()
    net.register_forward_hook(lambda *args: None)  # a hook table walks nothing
    assert held(net) == (640, 0)
    assert held({"model": net, "again": net.layers}) == (640, 0)


def test_with_an_appraiser_the_least_worth_goes_first_and_a_prewarm_takes_less() -> None:
    held = [Held("a", 300, 1.0), Held("b", 300, 2.0), Held("c", 300, 3.0)]
    worth = {"a": (5.0, False), "b": (0.1, False), "c": (4.0, True)}  # c: pre-warmed, due
    reasons: list[tuple[str, str]] = []
    budget = MemoryBudget(
        1000,
        lambda: held,
        appraise=lambda r: worth[r.key],
        evicted=lambda key, why: reasons.append((key, why)),
    )
    _loaded(budget.make_room("new", 200))
    # least recently used would take a; b is worth least
    assert [h.evicted for h in held] == [False, True, False]
    assert reasons == [("b", "budget")]
    # a pre-warm worth 4.5 takes only what is worth less, and never a due pre-warm: c
    # (worth 4.0, due) stays, a (5.0) stays: nothing it may take, so nothing is taken
    _loaded(budget.make_room("ahead", 600, below=4.5))
    assert [h.evicted for h in held] == [False, True, False]
    _loaded(budget.make_room("ahead", 600, below=6.0))  # worth more than a: a goes
    assert [h.evicted for h in held] == [True, True, False]
    assert [h.key for h in budget.held("new")] == ["c"]


def test_holders_are_what_a_budget_weighs() -> None:
    """The budget weighs the residents holding an instance, kept as they come and go
    (``InstancePool.holding``), not every version the node has served."""
    a, b = Held("a", 400, last_active_s=50), Held("b", 300, last_active_s=10)
    holders = Holders()
    budget = MemoryBudget(1000, holders)
    holders.holding(a, True)
    holders.holding(b, True)
    holders.holding(b, True)  # (told twice: held once)
    assert holders() == [a, b] and budget.used_bytes() == 700
    holders.holding(a, False)
    holders.holding(a, False)  # (gone already: nothing)
    assert holders() == [b] and budget.used_bytes() == 300
    _loaded(budget.make_room("c", 800))
    assert b.evicted and holders() == [b]  # (its pool says when it has let go)


def test_two_residents_of_one_key_are_each_evicted() -> None:
    """A version's scheduler still closing beside its replacement: the same key, two
    residents. Before, the choice went by key: one was unloaded twice over and the
    other counted as freed, and the load went over the budget."""
    closing, replacement = Held("f/v1", 400, last_active_s=10), Held("f/v1", 400, last_active_s=20)
    other = Held("g/v1", 200, last_active_s=30)
    budget = MemoryBudget(1000, lambda: [closing, replacement, other])
    _loaded(budget.make_room("new/v1", 900))
    assert closing.evicted and replacement.evicted and other.evicted
    assert budget.used_bytes() == 0


def test_a_version_scaling_out_counts_the_instances_it_holds() -> None:
    """A second instance of a loaded version: the first's bytes count (never evicted for
    it), so the idle one of another version goes, and the node stays in its budget."""
    serving, idle = Held("f/v1", 600, 5.0, busy=True), Held("g/v1", 400, 1.0)
    budget = MemoryBudget(1000, lambda: [serving, idle])
    _loaded(budget.make_room("f/v1", 600))
    assert idle.evicted and not serving.evicted
    quiet = Held("f/v1", 600, 5.0)  # its own idle instance is not evicted for its twin
    _loaded(MemoryBudget(1000, lambda: [quiet]).make_room("f/v1", 600))
    assert not quiet.evicted


@dataclass
class BusyAgain(Held):
    """A resident whose instance took a request while another was being evicted."""

    async def evict(self) -> bool:
        return False


def test_an_eviction_that_unloaded_nothing_is_not_counted(caplog: pytest.LogCaptureFixture) -> None:
    taken, idle = BusyAgain("w/v1", 400, 1.0), Held("v/v1", 400, 2.0)
    counted: list[tuple[str, str]] = []
    budget = MemoryBudget(1000, lambda: [taken, idle], evicted=lambda k, r: counted.append((k, r)))
    with caplog.at_level("INFO", logger="fnrt.memory"):
        _loaded(budget.make_room("new/v1", 1000))
    assert counted == [("v/v1", "budget")]
    assert "kept w/v1, busy again" in caplog.text


def test_a_load_bigger_than_the_whole_budget_says_so(caplog: pytest.LogCaptureFixture) -> None:
    held = [Held("a/v1", 300, 1.0)]
    with caplog.at_level("WARNING", logger="fnrt.memory"):
        _loaded(MemoryBudget(1000, lambda: held).make_room("big/v1", 5000))
    assert "big/v1 needs 5000 bytes, more than the whole memory budget (1000)" in caplog.text


def test_the_room_a_load_made_is_its_own_until_it_is_loaded() -> None:
    """Two loads at once: the first's room (not loaded yet: it holds no instance) counts
    for the second, which evicts for its own rather than take it; given back when the
    first is loaded (its instance then counts) or failed."""
    idle = Held("h/v1", 800, 1.0)
    budget = MemoryBudget(1000, lambda: [idle])

    async def scenario() -> None:
        first = await budget.make_room("f/v1", 200)  # 800 + 200 fit: nothing evicted
        assert not idle.evicted and budget.used_bytes() == 1000 and not budget.fits(1)
        second = await budget.make_room("g/v1", 200)  # the room is f's: h goes
        assert idle.evicted and budget.used_bytes() == 400
        first()
        second()
        assert budget.used_bytes() == 0
        first()  # (given back once)
        assert budget.reserved_bytes == 0

    asyncio.run(scenario())


@dataclass
class Stuck(Held):
    """A resident whose unload never ends (until cancelled)."""

    async def evict(self) -> bool:
        await asyncio.Event().wait()
        return True


def test_a_load_cancelled_while_it_makes_room_gives_the_room_back() -> None:
    stuck = Stuck("s/v1", 900, 1.0)
    budget = MemoryBudget(1000, lambda: [stuck])

    async def scenario() -> None:
        making = asyncio.ensure_future(budget.make_room("f/v1", 500))
        await asyncio.sleep(0.01)
        assert budget.reserved_bytes == 500  # held while it evicts
        making.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await making
        assert budget.reserved_bytes == 0

    asyncio.run(scenario())
