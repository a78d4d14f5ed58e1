from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from safetensors.torch import save_file

from fnrt.functions.errors import FnrtError, HandlerError
from fnrt.functions.handler import Device
from fnrt.loader.artifact import LocalArtifact
from fnrt.loader.formats import safetensors as st
from fnrt.loader.formats.torch import mapped_module, state_dict


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


def test_a_module_is_built_on_meta_with_the_mapped_weights_assigned(tmp_path: Path) -> None:
    def build() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))

    source = build()
    save_file(source.state_dict(), tmp_path / "w.safetensors")
    torch.save(source.state_dict(), tmp_path / "w.pt")
    x = torch.randn(5, 4)
    for name in ("w.safetensors", "w.pt"):
        path = tmp_path / name
        artifact = LocalArtifact("w", path, "0" * 64, path.stat().st_size, Device())
        made = artifact.module(build)
        assert not made.training
        torch.testing.assert_close(made(x), source(x))
    mapped = st.tensors(tmp_path / "w.safetensors")
    made = mapped_module(build, mapped)
    assert made[0].weight.data_ptr() == mapped["0.weight"].data_ptr()  # assigned, not copied
    save_file({"0.weight": source[0].weight.detach().contiguous()}, tmp_path / "part.safetensors")
    part = tmp_path / "part.safetensors"
    artifact = LocalArtifact("w", part, "0" * 64, part.stat().st_size, Device())
    with pytest.raises(RuntimeError, match="Missing key"):
        artifact.module(build)
    with pytest.raises(HandlerError, match=r"0\.bias.*stay empty"):
        artifact.module(build, strict=False)


#: Run in a fresh interpreter: torch imported, then a module with an embedding (whose
#: initialiser reaches torch's reference code) built on meta with mapped weights.
EMBEDDING_ON_META = """
import sys
import torch
from fnrt.loader.formats.torch import mapped_module
normal = torch.nn.init.normal_
made = mapped_module(
    lambda: torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.LayerNorm(4)),
    {"0.weight": torch.ones(8, 4), "1.weight": torch.ones(4), "1.bias": torch.zeros(4)},
)
assert made[0].weight.sum().item() == 32
assert torch.nn.init.normal_ is normal  # given back
print("torch._dynamo" in sys.modules)
"""


def test_a_module_built_on_meta_runs_no_initialiser(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", EMBEDDING_ON_META], capture_output=True, text=True, check=True
    )
    # before, nn.Embedding's normal_ on meta imported torch._dynamo: 1-4 s of the tiny-lm
    # example's first cold start
    assert done.stdout.strip() == "False"


def _mapped_pages(array: np.ndarray) -> tuple[int, int]:  # type: ignore[type-arg]
    """(pages of ``array`` this process's page tables map now, its pages), read from
    /proc/self/pagemap (bit 63: present), which maps nothing itself."""
    page = 4096
    start = array.ctypes.data // page
    end = (array.ctypes.data + array.nbytes + page - 1) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(start * 8)
        entries = np.frombuffer(f.read((end - start) * 8), dtype=np.uint64)
    return int(((entries >> np.uint64(63)) & np.uint64(1)).sum()), end - start


def test_a_file_mapped_ahead_has_its_page_tables_filled(tmp_path: Path) -> None:
    """The page tables of a file mapped ahead are filled on a thread of its own, and
    tensors() takes that mapping: its first read maps no page (mapped the plain way,
    none is mapped until read, page by page in faults)."""
    path = tmp_path / "w.safetensors"
    weights = np.arange(2 << 20, dtype=np.float32)  # 8 MiB
    st.save_arrays({"w": weights}, path)
    (tmp_path / "notes.txt").write_text("not weights")

    present, pages = _mapped_pages(st.tensors(path)["w"].numpy())
    assert present == 0 and pages >= 2048

    ahead = st.MappedAhead([path, tmp_path / "notes.txt", tmp_path, path])
    assert ahead.paths == [path]  # nothing else is mapped, and a file once
    assert ahead.wait(10)
    taken = st.tensors(path)["w"].numpy()
    present, pages = _mapped_pages(taken)
    assert present == pages
    np.testing.assert_array_equal(taken, weights)
    ahead.close()
    assert st.settled(10)


def test_a_read_only_caller_takes_a_file_mapped_ahead_read_only(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    st.save_arrays({"w": np.ones(1 << 20, np.float32)}, path)
    ahead = st.MappedAhead([path])
    assert ahead.wait(10)
    arrays = st.arrays(path)
    assert not arrays["w"].flags.writeable
    assert _mapped_pages(arrays["w"])[0] == _mapped_pages(arrays["w"])[1]
    ahead.close()


def test_what_a_load_did_not_take_is_let_go(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    st.save_arrays({"w": np.ones(1 << 20, np.float32)}, path)
    ahead = st.MappedAhead([path])
    ahead.close()  # the load used its own reader
    assert ahead.wait(10)
    assert _mapped_pages(st.tensors(path)["w"].numpy())[0] == 0  # a mapping of its own


def test_a_cgroup_quota_counts_as_fewer_cores(tmp_path: Path) -> None:
    cpu_max = tmp_path / "cpu.max"
    assert st.quota_cores(cpu_max) == float("inf")  # no cgroup v2 file: no quota
    cpu_max.write_text("max 100000\n")
    assert st.quota_cores(cpu_max) == float("inf")
    cpu_max.write_text("50000 100000\n")  # half a core: never one idle beside the caller
    assert st.quota_cores(cpu_max) == 0.5
    assert not st.core_idle(cpu_max)
