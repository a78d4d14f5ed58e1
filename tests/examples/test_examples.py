"""The shipped examples, built by their own scripts, served for real, checked against torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import msgpack
import msgpack_numpy
import numpy as np
import pytest
import torch

from fnrt.loader.process import ProcessInstance
from fnrt.runtime.cli.main import main
from support import LiveServer, live_server

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# A first call starts a worker process that imports torch and loads the model: on a
# busy 2-core machine running the suite in parallel that can pass httpx's 5 s default.
FIRST_CALL_TIMEOUT_S = 60.0


@pytest.fixture
def server(tmp_path: Path, built: Path, capsys: pytest.CaptureFixture[str]):
    with live_server(tmp_path) as srv:
        for name in ("mlp", "mlp-onnx"):
            assert main(["deploy", str(built / name), "--server", srv.url, "--quiet"]) == 0
        capsys.readouterr()
        yield srv


def reference(x: np.ndarray) -> np.ndarray:
    sys.path.insert(0, str(EXAMPLES / "mlp"))
    try:
        from model import seeded_mlp
    finally:
        sys.path.remove(str(EXAMPLES / "mlp"))
    with torch.inference_mode():
        return seeded_mlp(0)(torch.from_numpy(x)).numpy()


def sample() -> np.ndarray:
    return np.asarray(
        json.loads((EXAMPLES / "mlp" / "sample.json").read_text())["x"], dtype=np.float32
    )


@pytest.mark.parametrize("name", ["mlp", "mlp-onnx"])
def test_json_post_matches_the_network(server: LiveServer, name: str) -> None:
    x = sample()
    r = httpx.post(
        f"{server.url}/v1/functions/{name}/invoke",
        json={"x": x.tolist()},
        timeout=FIRST_CALL_TIMEOUT_S,
    )
    assert r.status_code == 200
    y = np.asarray(r.json()["y"], dtype=np.float32)
    assert y.shape == (1, 10)
    np.testing.assert_allclose(y, reference(x), atol=1e-5)


@pytest.mark.parametrize("name", ["mlp", "mlp-onnx"])
def test_msgpack_numpy_post_matches_the_network(server: LiveServer, name: str) -> None:
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    r = httpx.post(
        f"{server.url}/v1/functions/{name}/invoke",
        content=msgpack.packb({"x": x}, default=msgpack_numpy.encode),
        headers={"content-type": "application/msgpack"},
        timeout=FIRST_CALL_TIMEOUT_S,
    )
    y = msgpack.unpackb(r.content, object_hook=msgpack_numpy.decode)["y"]
    assert y.shape == (1, 10) and y.dtype == np.float32
    np.testing.assert_allclose(y, reference(x), atol=1e-5)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_json_post(server: LiveServer) -> None:
    out = subprocess.run(
        [
            "curl",
            "-sf",
            "-X",
            "POST",
            f"{server.url}/v1/functions/mlp/invoke",
            "-H",
            "content-type: application/json",
            "-d",
            f"@{EXAMPLES / 'mlp' / 'sample.json'}",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    np.testing.assert_allclose(
        np.asarray(json.loads(out)["y"], np.float32), reference(sample()), atol=1e-5
    )


def test_batched_rows_match_the_network(server: LiveServer) -> None:
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    with httpx.Client(base_url=server.url) as c:
        for name in ("mlp", "mlp-onnx"):
            y = np.asarray(
                c.post(f"/v1/functions/{name}/invoke", json={"x": x.tolist()}).json()["y"],
                np.float32,
            )
            np.testing.assert_allclose(y, reference(x), atol=1e-5)


def test_weights_are_mapped_not_copied(server: LiveServer) -> None:
    """The mlp worker maps the stored safetensors file (its parameters are views of it:
    tests/loader/test_process.py shows two workers sharing those pages)."""
    with httpx.Client(base_url=server.url) as c:
        c.post("/v1/functions/mlp/invoke", json={"x": sample().tolist()})
    scheduler = server.call(server.registry.get("mlp"))
    (instance,) = scheduler.pool.loaded_instances()
    assert isinstance(instance, ProcessInstance)  # the default isolation
    path = server.node.repository.blob_path(instance.version.artifacts["weights"].digest)
    assert str(path) in Path(f"/proc/{instance.pid}/maps").read_text()


def test_weights_are_views_of_the_file_in_thread_mode(tmp_path: Path, built: Path) -> None:
    """In a thread, the instance's parameters are views of the mapped file, not copies."""
    with live_server(tmp_path, isolation="thread") as server:
        assert main(["deploy", str(built / "mlp"), "--server", server.url, "--quiet"]) == 0
        with httpx.Client(base_url=server.url) as c:
            c.post("/v1/functions/mlp/invoke", json={"x": sample().tolist()})
        scheduler = server.call(server.registry.get("mlp"))
        (instance,) = scheduler.pool.loaded_instances()
        weight = instance.call.model[0].weight  # type: ignore[attr-defined]
        assert not weight.untyped_storage().resizable()  # from_numpy over the memmap
        path = server.node.repository.blob_path(instance.version.artifacts["weights"].digest)
        assert str(path) in Path("/proc/self/maps").read_text()


def test_the_wide_mlp_builds_on_meta_with_its_mapped_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "wide-mlp"
    shutil.copytree(EXAMPLES / "wide-mlp", folder, ignore=shutil.ignore_patterns("weights.*"))
    made = subprocess.run(
        [sys.executable, str(folder / "make_weights.py"), "--seed", "3"], capture_output=True
    )
    assert made.returncode == 0, made.stderr
    import importlib.util

    # the example's own network, seeded as its weights were (by path: "model" is taken)
    spec = importlib.util.spec_from_file_location("wide_mlp_model", folder / "model.py")
    assert spec is not None and spec.loader is not None
    network = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(network)
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    with torch.inference_mode():
        expected = network.seeded(3)(torch.from_numpy(x)).numpy()
    with live_server(tmp_path / "srv") as srv:
        assert main(["deploy", str(folder), "--server", srv.url, "--quiet"]) == 0
        r = httpx.post(
            f"{srv.url}/v1/functions/wide-mlp/invoke",
            json={"x": x.tolist()},
            timeout=FIRST_CALL_TIMEOUT_S,
        )
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.array(r.json()["y"]), expected, rtol=1e-4, atol=1e-5)
    capsys.readouterr()
