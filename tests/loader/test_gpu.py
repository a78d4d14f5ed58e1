"""The GPU path on a real device: streams, staging, loading, memory, metrics.

Every test here is marked ``gpu`` and skips without a CUDA device (conftest).
Tolerance of CUDA against CPU results: float32 with TF32 off (torch's default
for matmul), ``rtol=1e-4, atol=1e-5``: reductions run in another order there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from fnrt.loader.device import detect_device
from fnrt.loader.formats.safetensors import save_arrays
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.repository import Repository
from fnrt.loader.stores.file import FileStore
from fnrt.tracing.metrics import Metrics
from fnrt.tracing.telemetry import Telemetry
from support import FORWARD_WORKER_MANIFEST, live_server, make_node, write_function

pytestmark = pytest.mark.gpu

RTOL, ATOL = 1e-4, 1e-5


def _gpu_node(tmp: Path, telemetry: Telemetry | None = None, **settings: Any) -> Any:
    repository = Repository(FileStore(tmp / "store"))
    loader = InstanceLoader(repository, tmp / "cache", detect_device("cuda"))
    return make_node(tmp, telemetry=telemetry, loader=loader, **settings)


def _answers(tmp: Path, built: Path, names: list[str], gpu: bool, isolation: str) -> dict[str, Any]:
    node = _gpu_node(tmp, isolation=isolation) if gpu else make_node(tmp, isolation=isolation)
    rng = np.random.default_rng(1)
    out = {}
    with live_server(tmp, node=node) as srv, srv.client() as c:
        for name in names:
            srv.deploy(built / name)
            width = 256 if name == "wide-mlp" else 64
            x = rng.standard_normal((5, width)).astype(np.float32)
            r = c.post(f"/v1/functions/{name}/invoke", json={"x": x.tolist()})
            assert r.status_code == 200, r.text
            out[name] = np.array(r.json()["y"], np.float32)
    return out


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_examples_on_cuda_answer_as_on_cpu(tmp_path: Path, built: Path, isolation: str) -> None:
    names = ["mlp", "wide-mlp", "mlp-onnx"]  # __call__ (torch), forward (staged), onnxruntime
    on_cpu = _answers(tmp_path / "cpu", built, names, False, isolation)
    on_gpu = _answers(tmp_path / "gpu", built, names, True, isolation)
    for name in names:
        np.testing.assert_allclose(on_gpu[name], on_cpu[name], rtol=RTOL, atol=ATOL, err_msg=name)


STREAMS = """
import numpy as np
import torch
from fnrt.functions import Handler


class Plain(Handler):
    def load(self, artifacts, device):
        self.device = device
        self.at_load = torch.cuda.current_stream().cuda_stream

    def __call__(self, batch):
        now = torch.cuda.current_stream().cuda_stream
        seen = np.array([self.device.stream, self.at_load, now], np.int64)
        return [{"s": seen} for _ in batch]


class Staged(Handler):
    def load(self, artifacts, device):
        self.device = device

    def forward(self, inputs):
        x = inputs["x"]
        now = torch.cuda.current_stream().cuda_stream
        seen = torch.tensor([self.device.stream, now, x.device.index], device=x.device)
        return {"s": seen.repeat(x.shape[0], 1)}
"""

STREAMS_MANIFEST = """
name = "{name}"
handler = "handler:{cls}"

[inputs]
x = {{ dtype = "float32", shape = [-1, 2] }}

[outputs]
s = {{ dtype = "int64", shape = {shape} }}

[isolation]
mode = "{mode}"
"""


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_torch_handlers_run_on_the_instances_own_stream(tmp_path: Path, mode: str) -> None:
    with live_server(tmp_path, node=_gpu_node(tmp_path)) as srv, srv.client() as c:
        for name, cls, shape in (("plain", "Plain", "[3]"), ("staged", "Staged", "[-1, 3]")):
            folder = write_function(
                tmp_path / "src", name, STREAMS, STREAMS_MANIFEST, cls=cls, shape=shape, mode=mode
            )
            srv.deploy(folder)
        plain = c.post("/v1/functions/plain/invoke", json={"x": [[0.0, 1.0]]}).json()["s"]
        staged = c.post("/v1/functions/staged/invoke", json={"x": [[0.0, 1.0]] * 3}).json()["s"]
    stream, at_load, during = plain
    assert stream != 0  # never stream 0: fnrt's own, non-blocking
    assert at_load == during == stream
    assert {tuple(row) for row in staged} == {(staged[0][0], staged[0][0], 0)}
    assert staged[0][0] != 0


def test_onnxruntime_runs_on_the_instances_stream(tmp_path: Path, built: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no CUDA provider (install onnxruntime-gpu: fnrt[gpu])")
    from fnrt.loader.artifact import LocalArtifact
    from fnrt.loader.streams import CudaLanes

    lanes = CudaLanes(detect_device("cuda"))
    try:
        from dataclasses import replace

        device = replace(detect_device("cuda"), stream=lanes.compute.handle)
        path = built / "mlp-onnx" / "mlp.onnx"
        session = LocalArtifact("model", path, "", path.stat().st_size, device).onnx_session()
        options = session.get_provider_options()["CUDAExecutionProvider"]
        assert options["user_compute_stream"] == str(lanes.compute.handle) != "0"
        assert options["has_user_compute_stream"] == "1"
        x = np.ones((2, 64), np.float32)
        (y,) = session.run(None, {session.get_inputs()[0].name: x})
        assert y.shape[0] == 2
    finally:
        lanes.close()


BIG = """
from fnrt.functions import Handler
import torch


class Big(Handler):
    def load(self, artifacts, device):
        self.w = artifacts["weights"].tensors(device)["w"]

    def forward(self, inputs):
        return {"y": inputs["x"] @ self.w[:, :4]}
"""

BIG_MANIFEST = """
name = "{name}"
handler = "handler:Big"

[artifacts]
weights = "w.safetensors"

[inputs]
x = {{ dtype = "float32", shape = [-1, 8192] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 4] }}

[isolation]
mode = "{mode}"
"""


def _device_used_bytes() -> int:
    from cuda.bindings import runtime as cudart

    err, free, total = cudart.cudaMemGetInfo()
    assert err == cudart.cudaError_t.cudaSuccess
    return int(total - free)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_gpu_memory_is_released_on_scale_to_zero(tmp_path: Path, mode: str) -> None:
    import torch

    weights = tmp_path / "w.safetensors"
    save_arrays({"w": np.ones((8192, 8192), np.float32)}, weights)  # 256 MiB on the device
    folder = write_function(
        tmp_path / "src",
        "big",
        BIG,
        BIG_MANIFEST,
        mode=mode,
        files={"w.safetensors": weights.read_bytes()},
    )
    torch.cuda.init()
    with live_server(tmp_path, node=_gpu_node(tmp_path)) as srv, srv.client() as c:
        srv.deploy(folder)
        before = _device_used_bytes()
        r = c.post("/v1/functions/big/invoke", json={"x": np.ones((2, 8192)).tolist()})
        assert r.status_code == 200, r.text
        assert r.json()["y"] == [[8192.0] * 4] * 2
        loaded = _device_used_bytes()
        assert loaded - before >= 256 << 20
        assert c.post("/v1/functions/big/unload").status_code == 200
        after = _device_used_bytes()
    # all of the weights back; what may stay is the size of cuBLAS's state, not a model's
    assert after - before < 64 << 20, (before, loaded, after)


def test_staged_batches_in_flight_never_mix(tmp_path: Path, built: Path) -> None:
    """Many concurrent requests through the stage-ahead pipeline on the GPU: each answer
    is its own input's (a slot staged again before its batch was done would mix them)."""
    import asyncio

    with live_server(tmp_path, node=_gpu_node(tmp_path, isolation="thread")) as srv:
        srv.deploy(built / "wide-mlp")

        async def many() -> None:
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
                rng = np.random.default_rng(3)
                xs = [rng.standard_normal((1 + i % 3, 256)).astype(np.float32) for i in range(400)]
                first = await c.post("/v1/functions/wide-mlp/invoke", json={"x": xs[0].tolist()})
                assert first.status_code == 200
                answers = await asyncio.gather(
                    *(c.post("/v1/functions/wide-mlp/invoke", json={"x": x.tolist()}) for x in xs)
                )
                ys = [np.array(a.json()["y"], np.float32) for a in answers]
                # the same rows alone, one request each, in order: the reference
                for x, y in list(zip(xs, ys, strict=True))[::37]:
                    alone = await c.post("/v1/functions/wide-mlp/invoke", json={"x": x.tolist()})
                    np.testing.assert_allclose(y, np.array(alone.json()["y"]), rtol=RTOL, atol=ATOL)

        asyncio.run(many())
        stats = srv.call(srv.registry.get("wide-mlp")).describe()
    assert max(int(size) for size in stats["batch_sizes"]) > 1, stats  # batches did form


def test_safetensors_to_device_equals_safetensors_load(tmp_path: Path) -> None:
    import safetensors.torch
    import torch

    from fnrt.loader.transfer import TransferConfig, safetensors_to_device

    rng = np.random.default_rng(0)
    arrays = {
        "a_odd": np.arange(7, dtype=np.int8),  # the tensors after it start at odd offsets
        "b": rng.standard_normal((1000, 333)).astype(np.float32),
        "c": rng.standard_normal(50_001).astype(np.float16),
        "d": rng.integers(0, 1 << 40, 999).astype(np.int64),
    }
    path = tmp_path / "m.safetensors"
    save_arrays(arrays, path)
    expected = safetensors.torch.load_file(path, device="cuda")
    for config in (TransferConfig(), TransferConfig(chunk_bytes=4096, ring_chunks=3, readers=5)):
        got = safetensors_to_device(path, detect_device("cuda"), config)
        assert set(got) == set(expected)
        for name, tensor in expected.items():
            assert got[name].device.type == "cuda"
            assert torch.equal(got[name], tensor), name


def test_nvml_metrics_report_the_device(tmp_path: Path) -> None:
    pytest.importorskip("pynvml")
    node = _gpu_node(tmp_path, telemetry=Telemetry(metrics=Metrics()))  # NVML, as serve has
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        text = c.get("/metrics").text
    used = [line for line in text.splitlines() if line.startswith("fnrt_gpu_memory_used_bytes")]
    total = [line for line in text.splitlines() if line.startswith("fnrt_gpu_memory_total_bytes")]
    assert used and total, text[:2000]
    assert float(total[0].split()[-1]) > 16e9
    assert any(line.startswith("fnrt_gpu_utilization_ratio") for line in text.splitlines())


def _big_function(tmp_path: Path, name: str, mode: str = "thread", extra: str = "") -> Path:
    weights = tmp_path / f"{name}.safetensors"
    if not weights.exists():
        save_arrays({"w": np.ones((8192, 8192), np.float32)}, weights)  # 256 MiB
    return write_function(
        tmp_path / "src",
        name,
        BIG,
        BIG_MANIFEST + extra,
        mode=mode,
        files={"w.safetensors": weights.read_bytes()},
    )


def test_a_load_past_the_gpu_budget_evicts_the_least_recently_used(tmp_path: Path) -> None:
    """Two 256 MiB models under a 400 MiB GPU budget: the second's load unloads the
    first; GPU tensors count against the GPU's budget, not the host's."""
    node = _gpu_node(tmp_path, gpu_memory_budget_bytes=400 << 20)
    assert node.gpu_memory is not None and node.gpu_memory.budget_bytes == 400 << 20
    x = {"x": np.ones((1, 8192)).tolist()}
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        for name in ("big-a", "big-b"):
            folder = _big_function(tmp_path, name)
            srv.deploy(folder)
        assert c.post("/v1/functions/big-a/invoke", json=x).status_code == 200
        a = srv.call(srv.registry.get("big-a"))
        assert a.device_bytes >= 256 << 20 and a.resident_bytes < 64 << 20
        assert c.post("/v1/functions/big-b/invoke", json=x).status_code == 200
        b = srv.call(srv.registry.get("big-b"))
        assert b.device_bytes >= 256 << 20
        assert a.pool.loaded_instances() == [] and a.device_bytes == 0  # evicted for b
        assert node.gpu_memory.used_bytes() == b.device_bytes


SLOW = """
import time
from fnrt.functions import Handler


class Slow(Handler):
    def forward(self, inputs):
        time.sleep(0.02)
        return {"y": inputs["x"][:, :4]}
"""

SLOW_MANIFEST = """
name = "{name}"
handler = "handler:Slow"

[inputs]
x = {{ dtype = "float32", shape = [-1, 8] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 4] }}

[batching]
max_batch_size = 2

[scaling]
max_instances = 4
scale_up_after_ms = 20
max_queue = 4096

[isolation]
mode = "thread"
"""


def test_gpu_concurrency_caps_the_instances_sharing_the_gpu(tmp_path: Path) -> None:
    import asyncio

    node = _gpu_node(tmp_path, gpu_concurrency=2)
    with live_server(tmp_path, node=node) as srv:
        folder = write_function(tmp_path / "src", "slow", SLOW, SLOW_MANIFEST)
        srv.deploy(folder)
        scheduler = srv.call(srv.registry.get("slow"))
        most = 0

        async def flood() -> None:
            nonlocal most
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
                calls = [
                    c.post("/v1/functions/slow/invoke", json={"x": [[1.0] * 8]}) for _ in range(300)
                ]
                pending = asyncio.ensure_future(asyncio.gather(*calls))
                while not pending.done():
                    most = max(most, scheduler.pool.instances)
                    await asyncio.sleep(0.01)
                assert all(r.status_code == 200 for r in pending.result())

        asyncio.run(flood())
    assert most == 2  # it scaled up, to the cap and not to max_instances = 4


# --- #43: worker processes that overlap, GPU memory counted, every GPU ----------------------

FORWARD = """
import torch
from fnrt.functions import Handler


class Forward(Handler):
    def load(self, artifacts, device):
        self.w = torch.full((2, 2), 0.0, device=device.torch) + torch.eye(2, device=device.torch)

    def forward(self, inputs):
        x = inputs["x"]
        return {"y": (x @ self.w) * 2 + 1}
"""


def test_400_staged_requests_in_a_worker_on_the_gpu_each_get_their_own_answer(
    tmp_path: Path,
) -> None:
    import asyncio

    from fnrt.loader.process import ProcessInstance

    folder = write_function(
        tmp_path / "src", "fwd", FORWARD, FORWARD_WORKER_MANIFEST, cls="Forward"
    )
    with live_server(tmp_path, node=_gpu_node(tmp_path)) as srv:
        srv.deploy(folder)

        async def all_at_once() -> list[httpx.Response]:
            limits = httpx.Limits(max_connections=400)
            async with httpx.AsyncClient(base_url=srv.url, limits=limits, timeout=60) as client:
                body = lambda i: {"x": [[float(i), -float(i)]]}  # noqa: E731
                posts = (client.post("/v1/functions/fwd/invoke", json=body(i)) for i in range(400))
                return list(await asyncio.gather(*posts))

        for i, response in enumerate(asyncio.run(all_at_once())):
            assert response.status_code == 200, response.text
            assert response.json()["y"] == [[2.0 * i + 1, -2.0 * i + 1]]
        (instance,) = srv.call(srv.registry.get("fwd")).pool.loaded_instances()
        assert isinstance(instance, ProcessInstance) and instance.sent_ahead > 0
        assert str(instance.device) == "cuda:0"


def test_a_workers_cuda_context_is_measured_into_the_gpu_budget(tmp_path: Path) -> None:
    folder = write_function(
        tmp_path / "src", "fwd", FORWARD, FORWARD_WORKER_MANIFEST, cls="Forward"
    )
    before = _device_used_bytes()
    node = _gpu_node(tmp_path)
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        srv.deploy(folder)
        assert c.post("/v1/functions/fwd/invoke", json={"x": [[1.0, 2.0]]}).status_code == 200
        (instance,) = srv.call(srv.registry.get("fwd")).pool.loaded_instances()
        used = _device_used_bytes() - before
        assert instance.context_bytes > 64 << 20  # a CUDA context is hundreds of MiB
        counted = node.gpu_memory.used_bytes()
        assert counted >= instance.context_bytes
        assert abs(counted - used) <= 0.05 * used, (counted >> 20, used >> 20)
        assert c.get("/v1/functions/fwd").json()["instance"]["devices"] == ["cuda:0"]


def test_instances_go_to_the_gpu_with_the_most_free_budget(tmp_path: Path) -> None:
    from fnrt.loader.device import cuda_device_count
    from fnrt.runtime.node import build_node
    from support import node_settings

    if cuda_device_count() < 2:
        pytest.skip("needs two GPUs")
    node = build_node(node_settings(tmp_path, device="cuda", isolation="process"))
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        for name in ("a", "b"):
            folder = write_function(
                tmp_path / "src", name, FORWARD, FORWARD_WORKER_MANIFEST, cls="Forward"
            )
            srv.deploy(folder)
            assert c.post(f"/v1/functions/{name}/invoke", json={"x": [[1.0, 2.0]]}).is_success
        devices = {c.get(f"/v1/functions/{n}").json()["instance"]["devices"][0] for n in "ab"}
    assert devices == {"cuda:0", "cuda:1"}  # the second went to the emptier GPU
