from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from safetensors.torch import save_file

from fnrt.functions.errors import FnrtError
from fnrt.loader.formats import safetensors as st
from fnrt.loader.formats.torch import state_dict


def test_save_arrays_is_readable_by_the_safetensors_package(tmp_path: Path) -> None:
    arrays = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([1, 2], np.int64),
        "c": np.ones(3, np.float16),
    }
    st.save_arrays(arrays, tmp_path / "w.safetensors")
    loaded = load_file(tmp_path / "w.safetensors")
    for k, v in arrays.items():
        np.testing.assert_array_equal(loaded[k], v)


def test_tensors_map_the_file_including_bf16(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    source = {"w": torch.randn(4, 4), "h": torch.randn(3).to(torch.bfloat16)}
    save_file(source, path)
    mapped = st.tensors(path)
    torch.testing.assert_close(mapped["w"], source["w"])
    assert mapped["h"].dtype == torch.bfloat16
    torch.testing.assert_close(mapped["h"], source["h"])
    arrays = st.arrays(path)
    assert isinstance(arrays["w"].base, np.memmap) or isinstance(arrays["w"], np.memmap)
    assert not arrays["w"].flags.writeable
    # writing to a mapped tensor never changes the file (copy-on-write)
    mapped["w"].add_(1)
    torch.testing.assert_close(st.tensors(path)["w"], source["w"])


def test_not_a_safetensors_file(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"\xff" * 16)
    with pytest.raises(FnrtError, match="not a safetensors file"):
        st.arrays(tmp_path / "x")


def test_torch_checkpoints_load_mapped_and_refuse_pickled_code(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "ok.pt")
    assert torch.equal(state_dict(tmp_path / "ok.pt")["w"], torch.ones(2))

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (print, ("pwned",))

    torch.save({"w": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        state_dict(tmp_path / "evil.pt")
