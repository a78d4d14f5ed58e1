"""Reads through the ring into "device" memory, on the CPU's lanes (host memory)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fnrt.functions.errors import FnrtError
from fnrt.functions.handler import Device
from fnrt.loader.formats.safetensors import save_arrays
from fnrt.loader.streams import Lanes
from fnrt.loader.transfer import TransferConfig, read_to_device, safetensors_to_device

SMALL = TransferConfig(chunk_bytes=4096, ring_chunks=3, readers=4)


@pytest.mark.parametrize(
    ("size", "offset", "config"),
    [
        (100_003, 0, SMALL),  # 25 chunks through a ring of 3, the last one short
        (100_003, 17, SMALL),  # from an offset that is no multiple of anything
        (4096 * 3, 0, SMALL),  # exactly the ring
        (5000, 0, TransferConfig(chunk_bytes=4096, ring_chunks=2, readers=8)),  # readers > chunks
        (1 << 20, 0, TransferConfig()),  # one chunk of the default size
    ],
)
def test_every_byte_arrives_in_place(
    tmp_path: Path, size: int, offset: int, config: TransferConfig
) -> None:
    data = np.random.default_rng(size).integers(0, 256, size + offset, dtype=np.uint8)
    path = tmp_path / "blob"
    data.tofile(path)
    out = np.zeros(size, np.uint8)
    moved = read_to_device(path, offset, size, out.ctypes.data, Lanes(), config)
    assert moved.nbytes == size and moved.seconds > 0
    np.testing.assert_array_equal(out, data[offset:])


def test_nothing_to_read_is_no_work(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    assert read_to_device(tmp_path / "empty", 0, 0, 0, Lanes()).nbytes == 0


def test_a_file_shorter_than_asked_fails_and_the_ring_is_free_after(tmp_path: Path) -> None:
    path = tmp_path / "short"
    path.write_bytes(b"x" * 10_000)
    out = np.zeros(20_000, np.uint8)
    with pytest.raises(FnrtError, match=r"ended .* bytes early"):
        read_to_device(path, 0, 20_000, out.ctypes.data, Lanes(), SMALL)
    read_to_device(path, 0, 10_000, out.ctypes.data, Lanes(), SMALL)  # not left locked
    assert bytes(out[:10_000]) == b"x" * 10_000


def test_a_bad_config_is_refused() -> None:
    for bad in ({"chunk_bytes": 100}, {"ring_chunks": 1}, {"readers": 0}):
        with pytest.raises(ValueError, match="chunk_bytes"):
            TransferConfig(**bad)  # type: ignore[arg-type]


def test_safetensors_tensors_are_views_of_one_allocation(tmp_path: Path) -> None:
    arrays = {
        "a": np.arange(7, dtype=np.int8),  # later tensors start at odd offsets: copied once
        "b": np.random.default_rng(0).standard_normal((300, 33)).astype(np.float32),
        "c": np.arange(10, dtype=np.int64),
        "d": np.float16(np.linspace(0, 1, 99)),
    }
    path = tmp_path / "m.safetensors"
    save_arrays(arrays, path)
    got = safetensors_to_device(path, Device("cpu"), SMALL)
    for name, array in arrays.items():
        np.testing.assert_array_equal(got[name].numpy(), array)
    assert got["a"].untyped_storage().data_ptr() == got["a"].data_ptr()  # the allocation itself
    assert isinstance(got["b"], torch.Tensor)
