"""Which GPU an instance goes to: the pure choice, and the node's GPUs with fake holders."""

from __future__ import annotations

from pathlib import Path

import pytest

from fnrt.functions.handler import Device
from fnrt.loader.placement import DeviceRoom, Placement, place
from support import live_server, publish, write_function

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
        srv.call(srv.node.deployer.deploy(publish(srv.node.repository, folder)))
        assert (
            c.post("/v1/functions/echo/invoke", json={"x": [[1.0, 2.0, 3.0, 4.0]]}).status_code
            == 200
        )
        assert c.get("/v1/functions/echo").json()["instance"]["devices"] == ["cpu"]
        version = srv.call(srv.registry.get("echo")).version.version
        metrics = c.get("/metrics").text
        line = f'fnrt_instances_on_device{{device="cpu",function="echo",version="{version}"}} 1.0'
        assert line in metrics, [m for m in metrics.splitlines() if "on_device" in m]
