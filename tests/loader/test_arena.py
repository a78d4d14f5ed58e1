"""Shared-memory arenas: a batch written on one side is the same batch on the other."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from fnrt.loader.arena import Arena
from support import open_fds


def _assert_same(sent_batch: list[dict], got: list[dict]) -> None:
    """Each request arrived with the arrays it was sent, values and shapes."""
    for sent, received in zip(sent_batch, got, strict=True):
        assert sent.keys() == received.keys()
        for name, array in sent.items():
            np.testing.assert_array_equal(received[name], array)
            assert received[name].shape == array.shape


def test_a_batch_crosses_unchanged_and_the_arena_grows(tmp_path: Path) -> None:
    writer = Arena(tmp_path / "a", create=True)
    reader = Arena(tmp_path / "a", create=False)
    batch = [
        {
            "f": np.arange(12, dtype=np.float32).reshape(3, 4),
            "big_endian": np.arange(3, dtype=">i4"),
            "b": np.array([True, False]),
            "bf": np.ones((2, 2), ml_dtypes.bfloat16),
            "text": np.array([b"ab", b""], dtype=object),
            "empty": np.zeros((0, 4), np.float16),
        },
        {"large": np.full((1 << 19, 4), 7, np.float32)},  # 8 MiB: past the first mapping
    ]
    layout = writer.write(batch)
    assert writer.size_bytes >= 8 << 20
    got = reader.read(layout, copy=False)
    _assert_same(batch, got)
    assert got[0]["big_endian"].dtype == np.dtype("int32")  # native order on arrival
    assert not got[1]["large"].flags.writeable  # a view of the arena: read-only
    copied = reader.read(layout, copy=True)
    writer.write([{"large": np.zeros((1 << 19, 4), np.float32)}])  # the next batch
    assert float(copied[1]["large"][0, 0]) == 7.0  # the copy kept its values
    writer.close(unlink=True)
    reader.close()
    assert not (tmp_path / "a").exists()


def test_a_batch_of_like_requests_goes_in_one_block_a_tensor(tmp_path: Path) -> None:
    writer = Arena(tmp_path / "a", create=True)
    reader = Arena(tmp_path / "a", create=False)
    batch = [
        {"x": np.full((rows, 4), i, ">f4"), "ids": np.arange(rows, dtype=np.int64)}
        for i, rows in enumerate((1, 3, 0, 2))
    ]
    layout = writer.write(batch)
    assert [stack[0] for stack in layout["stacked"]] == ["x", "ids"]
    assert layout["stacked"][0][4] == [1, 3, 0, 2]  # each request's rows
    got = reader.read(layout, copy=False)
    _assert_same(batch, got)
    assert not any(a.flags.writeable for r in got for a in r.values())  # views: read-only
    assert got[1]["x"].dtype == np.dtype("float32")  # native order on arrival
    copied = reader.read(layout, copy=True)
    writer.write([{"x": np.zeros((9, 4), np.float32)}] * 2)  # the next batch
    assert copied[3]["x"].tolist() == [[3.0] * 4] * 2  # the copy kept its values
    assert copied[3]["x"].base is copied[1]["x"].base  # small: one copy, shared


def test_a_large_stacked_block_is_copied_out_a_request_at_a_time(tmp_path: Path) -> None:
    writer = Arena(tmp_path / "a", create=True)
    reader = Arena(tmp_path / "a", create=False)
    batch = [{"y": np.full((1 << 17, 2), i, np.float32)} for i in range(2)]  # 2 MiB in all
    copied = reader.read(writer.write(batch), copy=True)
    assert [float(c["y"][0, 0]) for c in copied] == [0.0, 1.0]
    assert all(c["y"].flags.owndata for c in copied)  # one kept answer holds only its own


def test_requests_that_differ_go_in_an_array_at_a_time(tmp_path: Path) -> None:
    writer = Arena(tmp_path / "a", create=True)
    reader = Arena(tmp_path / "a", create=False)
    unlike = [
        [{"x": np.ones((1, 4), np.float32)}, {"x": np.ones((1, 4), np.float64)}],  # dtype
        [{"x": np.ones((1, 4), np.float32)}, {"x": np.ones((1, 5), np.float32)}],  # shape
        [{"x": np.ones((1, 4), np.float32)}, {"z": np.ones((1, 4), np.float32)}],  # names
        [{"x": np.ones(2)}, {"x": np.ones(2), "z": np.ones(2)}],  # a name more
        [{"x": np.array(1.0)}, {"x": np.array(2.0)}],  # no first axis to stack on
        [{"t": np.array([b"a"], dtype=object)}, {"t": np.array([b"b"], dtype=object)}],
        [{"x": np.ones((1, 4), np.float32)}],  # one request: nothing to stack
    ]
    for batch in unlike:
        layout = writer.write(batch)
        assert "stacked" not in layout
        _assert_same(batch, reader.read(layout, copy=True))


def _held(path: Path) -> tuple[int, int]:
    """Descriptors of ``path`` this process holds open, and its mappings of it."""
    fds = sum(what.startswith(str(path)) for what in open_fds().values())
    maps = sum(str(path) in line for line in Path("/proc/self/maps").read_text().splitlines())
    return fds, maps


def test_a_closed_arena_lets_go_of_its_mapping_though_something_still_holds_it(
    tmp_path: Path,
) -> None:
    """mmap keeps a descriptor of its own: close() let go of the file's but not the
    mapping's, which stayed until the collector freed the arena. A worker's arenas are
    frozen out of the collector after its load, so each worker that died kept four
    descriptors and four mappings of /dev/shm until the next unload."""
    writer = Arena(tmp_path / "a", create=True)
    reader = Arena(tmp_path / "a", create=False)
    kept = [writer, reader]  # as a dead worker's instance, frozen, holds its arenas
    view = reader.read(writer.write([{"x": np.full((1, 4), 3, np.float32)}]), copy=False)
    assert _held(tmp_path / "a") == (4, 2)  # each: its file, and its mapping's copy of it
    writer.close(unlink=True)
    reader.close()
    assert _held(tmp_path / "a") == (1, 1)  # the view still reads the reader's mapping
    assert view[0]["x"].tolist() == [[3.0] * 4]
    del view
    assert _held(tmp_path / "a") == (0, 0)  # and it closes with the view
    with pytest.raises(ValueError, match="closed"):
        kept[0].write([{"x": np.ones((1, 4), np.float32)}])
