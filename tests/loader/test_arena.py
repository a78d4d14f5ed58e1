"""Shared-memory arenas: a batch written on one side is the same batch on the other."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np

from fnrt.loader.arena import Arena


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
    for sent, received in zip(batch, got, strict=True):
        assert sent.keys() == received.keys()
        for name, array in sent.items():
            np.testing.assert_array_equal(received[name], array)
            assert received[name].shape == array.shape
    assert got[0]["big_endian"].dtype == np.dtype("int32")  # native order on arrival
    assert not got[1]["large"].flags.writeable  # a view of the arena: read-only
    copied = reader.read(layout, copy=True)
    writer.write([{"large": np.zeros((1 << 19, 4), np.float32)}])  # the next batch
    assert float(copied[1]["large"][0, 0]) == 7.0  # the copy kept its values
    writer.close(unlink=True)
    reader.close()
    assert not (tmp_path / "a").exists()
