"""Which GPU an instance goes to: the pure choice, and the node's GPUs with fake holders."""

from __future__ import annotations

from pathlib import Path

import pytest

from fnrt.functions.handler import Device
from fnrt.loader.placement import DeviceRoom, Placement, place
from support import live_server, write_function

GIB = 1 << 30


def _room(index: int, free_gib: int, instances: int = 0, budget_gib: int = 80) -> DeviceRoom:
    return DeviceRoom(
        Device("cuda", index), budget_gib * GIB, (budget_gib - free_gib) * GIB, instances
    )


def test_the_gpu_with_the_most_free_budget_is_chosen() -> None:
    rooms = [_room(0, 10), _room(1, 50), _room(2, 30)]
    assert place(rooms) == Device("cuda", 1)


def test_a_gpu_at_its_cap_is_passed_over() -> None:
    rooms = [_room(0, 10, instances=1), _room(1, 50, instances=4), _room(2, 30, instances=2)]
    assert place(rooms, cap=4) == Device("cuda", 2)
    assert place([_room(0, 10, instances=4)], cap=4) is None  # every GPU full
    assert place([_room(0, 10, instances=9)], cap=0) == Device("cuda", 0)  # 0: no cap


def test_ties_go_to_fewer_instances_then_the_lower_number() -> None:
    assert place([_room(0, 20, instances=2), _room(1, 20, instances=1)]) == Device("cuda", 1)
    assert place([_room(3, 20), _room(1, 20)]) == Device("cuda", 1)


def test_each_gpu_has_its_own_budget() -> None:
    """A smaller GPU with less used can still have less free than a larger one."""
    rooms = [_room(0, 15, budget_gib=20), _room(1, 20, budget_gib=80)]
    assert place(rooms) == Device("cuda", 1)


def test_loads_on_their_way_count_where_they_were_placed() -> None:
    held: list[tuple[Device, int]] = [(Device("cuda", 0), 30 * GIB)]
    gpus = [Device("cuda", 1), Device("cuda", 0)]  # cuda:1,cuda:0 as listed
    placement = Placement(gpus, {0: 80 * GIB, 1: 80 * GIB}, lambda: held, cap=2)
    first = placement.choose(40 * GIB)
    assert first == Device("cuda", 1)  # 80 free against 50
    second = placement.choose(20 * GIB)  # cuda:1 has 40 free counting the first: 0 has 50
    assert second == Device("cuda", 0)
    assert placement.has_room()  # one each on the way, one held: 1 and 2 of a cap of 2
    third = placement.choose(1)
    assert third == Device("cuda", 1)
    assert not placement.has_room()  # both at their cap
    placement.placed(first, 40 * GIB)  # loaded: now held
    held.append((first, 40 * GIB))
    rows = {row["device"]: row for row in placement.describe()}
    assert rows["cuda:1"]["used_bytes"] == 40 * GIB + 1 and rows["cuda:1"]["instances"] == 2
    assert rows["cuda:0"]["used_bytes"] == 50 * GIB and rows["cuda:0"]["instances"] == 2


def test_placement_is_for_gpus() -> None:
    with pytest.raises(ValueError, match="devices"):
        Placement([Device("cpu")], {0: 1}, lambda: [])


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_describe_and_metrics_name_the_device_of_every_instance(
    tmp_path: Path, isolation: str
) -> None:
    """On the CPU, the twin of a GPU node: each instance says where it runs."""
    folder = write_function(tmp_path / "src", "echo")
    with live_server(tmp_path, isolation=isolation) as srv, srv.client() as c:
        srv.deploy(folder)
        assert (
            c.post("/v1/functions/echo/invoke", json={"x": [[1.0, 2.0, 3.0, 4.0]]}).status_code
            == 200
        )
        assert c.get("/v1/functions/echo").json()["instance"]["devices"] == ["cpu"]
        version = srv.call(srv.registry.get("echo")).version.version
        metrics = c.get("/metrics").text
        line = f'fnrt_instances_on_device{{device="cpu",function="echo",version="{version}"}} 1.0'
        assert line in metrics, [m for m in metrics.splitlines() if "on_device" in m]


class _Instance:
    def __init__(self, index: int, nbytes: int) -> None:
        self.device = Device("cuda", index)
        self.device_bytes = nbytes


class _Pool:
    def __init__(self, instances: list[_Instance]) -> None:
        self.instances = instances

    def loaded_instances(self) -> list[_Instance]:
        return self.instances


class _Version:
    """A loaded version as the budgets see it (runtime/scheduler.py's Resident view)."""

    def __init__(self, key: str, on: dict[int, int], last_active_s: float) -> None:
        self.key = key
        self.pool = _Pool([_Instance(i, n) for i, n in on.items()])
        self.last_active_s = last_active_s
        self.busy = False
        self.resident_bytes = 0
        self.evicted = False

    @property
    def device_bytes(self) -> int:
        return sum(i.device_bytes for i in self.pool.instances)

    async def evict(self) -> bool:
        self.evicted = True
        self.pool.instances = []
        return True


def test_a_load_makes_room_on_the_gpu_it_will_go_to_only() -> None:
    import asyncio

    from fnrt.loader.placement import GpuBudgets

    versions = [
        _Version("old-on-0", {0: 30 * GIB}, last_active_s=1.0),
        _Version("older-on-1", {1: 20 * GIB}, last_active_s=0.5),  # the LRU, but elsewhere
        _Version("new-on-0", {0: 30 * GIB}, last_active_s=2.0),
    ]
    gpus = [Device("cuda", 0), Device("cuda", 1)]
    held = lambda: [(i.device, i.device_bytes) for v in versions for i in v.pool.instances]  # noqa: E731
    placement = Placement(gpus, {0: 80 * GIB, 1: 40 * GIB}, held)
    budgets = GpuBudgets(placement, lambda: versions)  # type: ignore[arg-type]
    assert budgets.budget_bytes == 120 * GIB and budgets.used_bytes() == 80 * GIB
    assert placement.peek() == Device("cuda", 1)  # 20 free against 20: fewer instances
    versions[2].pool.instances.append(_Instance(0, 1))  # now cuda:0 has less free
    asyncio.run(budgets.make_room("loading", 30 * GIB))  # cuda:1 has 20 of its 40 free
    assert [v.key for v in versions if v.evicted] == ["older-on-1"]  # only what is there
    versions[1].pool.instances = [_Instance(1, 35 * GIB)]
    versions[1].evicted = False
    asyncio.run(budgets.make_room("loading", 30 * GIB))  # cuda:0 now: 20 free of 80
    assert [v.key for v in versions if v.evicted] == ["old-on-0"]  # the LRU on cuda:0
