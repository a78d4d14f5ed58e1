"""The pool's scaling decisions alone: slots as plain records, times given."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fnrt.runtime.scaler import Scaler
from support import packed, write_function

MANIFEST = """
name = "{name}"
handler = "handler:Echo"

[batching]
max_batch_size = 4

[scaling]
keep_alive_s = 300
scale_down_after_s = 30
min_instances = 0
max_instances = 3
scale_up_after_ms = 1000
"""


@dataclass
class Place:
    index: int
    instance: Any = None
    running: bool = False
    last_active: float = 0.0

    @property
    def primary(self) -> bool:
        return self.index == 0


def _scaler(tmp_path: Path, **kw: Any) -> Scaler:
    return Scaler(packed(write_function(tmp_path, "s", manifest=MANIFEST))[0].manifest, **kw)


def test_another_instance_after_the_queue_stays_deep(tmp_path: Path) -> None:
    scaler = _scaler(tmp_path)
    slots = [Place(0, object())]
    assert not scaler.wants_another(slots, False, queued=4, now=10.0)  # deep since now
    assert not scaler.wants_another(slots, False, queued=4, now=10.5)
    assert scaler.wants_another(slots, False, queued=4, now=11.0)
    assert not scaler.wants_another(slots, True, queued=4, now=11.0)  # one load at a time
    assert not scaler.wants_another(slots, False, queued=3, now=12.0)  # drained: again
    assert not scaler.wants_another(slots, False, queued=8, now=12.5)
    assert scaler.wants_another(slots, False, queued=2, now=13.5, batch_size=2)
    full = [Place(i, object()) for i in range(3)]
    assert not scaler.wants_another(full, False, queued=99, now=20.0)  # max_instances


def test_a_gpu_without_room_gets_no_other_instance(tmp_path: Path) -> None:
    room = [False]
    scaler = _scaler(tmp_path, device_room=lambda: room[0])
    slots = [Place(0, object())]
    scaler.wants_another(slots, False, queued=4, now=0.0)
    assert not scaler.wants_another(slots, False, queued=4, now=5.0)
    room[0] = True
    assert scaler.wants_another(slots, False, queued=4, now=5.0)


def test_idle_instances_go_newest_first_each_after_its_own_keep_alive(tmp_path: Path) -> None:
    scaler = _scaler(tmp_path)
    first, extra, busy = Place(0, object()), Place(1, object()), Place(2, object(), running=True)
    slots = [first, extra, busy]
    assert scaler.idle(slots, queued=0, now=29.0) == []
    assert scaler.idle(slots, queued=0, now=30.0) == [extra]  # scale_down_after_s
    assert scaler.idle(slots, queued=1, now=30.0) == []  # work is waiting
    assert scaler.idle(slots, queued=0, now=300.0) == [extra, first]  # keep_alive_s
    assert scaler.idle(slots, queued=0, now=300.0, keep_primary=True) == [extra]
    assert scaler.idle(slots, queued=0, now=1.0, force=True) == [extra, first]  # not busy
    assert scaler.idle([Place(0)], queued=0, now=1e9) == []  # nothing loaded


def test_never_below_min_instances_unless_forced(tmp_path: Path) -> None:
    manifest = MANIFEST.replace("min_instances = 0", "min_instances = 1")
    scaler = Scaler(packed(write_function(tmp_path, "m", manifest=manifest))[0].manifest)
    first, extra = Place(0, object()), Place(1, object())
    assert scaler.idle([first, extra], queued=0, now=1000.0) == [extra]  # one stays
    assert scaler.idle([first], queued=0, now=1000.0) == []
    assert scaler.idle([first, extra], queued=0, now=1000.0, force=True) == [extra, first]
