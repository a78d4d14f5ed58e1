from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import support


def _share_default_ssl_context() -> None:
    """httpx reads the CA bundle into a new SSL context for every client it makes (about
    30 ms), even one that only ever speaks http:// to 127.0.0.1, and the tests make
    hundreds (``httpx.get`` makes one a call). Clients made with the default settings
    share one context here; any other settings (a test's own CA, verify=False) get
    their own, as before."""
    import httpx._transports.default as transports

    build = transports.create_ssl_context
    shared: list[Any] = []

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
        if verify is not True or cert is not None or not trust_env:
            return build(verify=verify, cert=cert, trust_env=trust_env)
        if not shared:
            shared.append(build())
        return shared[0]

    transports.create_ssl_context = create_ssl_context  # type: ignore[assignment]


_share_default_ssl_context()


@pytest.fixture(autouse=True)
def _fresh_gates() -> Iterator[None]:
    support.reset_gates()
    yield
    for event in support.gates.events.values():  # type: ignore[attr-defined]
        event.set()  # never leave a handler thread blocked


@pytest.fixture(autouse=True)
def _no_collection_left() -> Iterator[None]:
    """What a test's thread instances left at their unload is collected before the next
    test starts: the process's collector is one for every test of a worker, and its
    timer must not fire inside another test (one that counts collections, say)."""
    yield
    from fnrt.runtime.collector import COLLECTOR

    COLLECTOR.settle()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from fnrt.loader.device import cuda_device_count

    if cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A moto S3 server on 127.0.0.1 with bucket ``fnrt`` (credentials set for boto3)."""
    from s3support import CREDENTIALS, moto_endpoint

    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    with moto_endpoint() as endpoint:
        endpoint.make_bucket("fnrt")
        yield endpoint


@pytest.fixture
def proxy(s3):  # type: ignore[no-untyped-def]
    """A fault-injecting proxy in front of the ``s3`` endpoint."""
    from s3support import FaultProxy

    port = int(s3.url.rsplit(":", 1)[1])
    fault_proxy = FaultProxy(port)
    yield fault_proxy
    fault_proxy.close()


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Copies of the mlp, mlp-onnx and wide-mlp examples with the weights and the ONNX file
    their scripts make."""
    root = tmp_path_factory.mktemp("examples")
    examples = Path(__file__).resolve().parent.parent / "examples"
    for name in ("mlp", "mlp-onnx", "wide-mlp"):
        shutil.copytree(
            examples / name,
            root / name,
            ignore=shutil.ignore_patterns("*.safetensors", "*.onnx", "__pycache__"),
        )
    weights = root / "mlp" / "weights.safetensors"
    subprocess.run(
        [sys.executable, str(root / "mlp" / "make_weights.py"), "--out", str(weights)], check=True
    )
    subprocess.run(
        [
            sys.executable,
            str(root / "mlp-onnx" / "export.py"),
            "--weights",
            str(weights),
            "--out",
            str(root / "mlp-onnx" / "mlp.onnx"),
        ],
        check=True,
    )
    wide = root / "wide-mlp"
    subprocess.run(
        [sys.executable, str(wide / "make_weights.py"), "--out", str(wide / "weights.safetensors")],
        check=True,
    )
    return root


@pytest.fixture(scope="session")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the split-capable ``cnn-split`` example, its ONNX model made by its script."""
    folder = tmp_path_factory.mktemp("examples") / "cnn-split"
    examples = Path(__file__).resolve().parent.parent / "examples"
    shutil.copytree(
        examples / "cnn-split", folder, ignore=shutil.ignore_patterns("*.onnx", "__pycache__")
    )
    subprocess.run(
        [sys.executable, str(folder / "export.py"), "--out", str(folder)],
        check=True,
        capture_output=True,
    )
    return folder
