from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fnrt.functions.handler import Device
from fnrt.loader.device import (
    DeviceChoice,
    DeviceRefused,
    Visible,
    context_cost,
    cuda_device_count,
    describe_choice,
    detect_device,
    free_bytes_now,
    parse_device,
    process_device_bytes,
    resolve,
)

GPU_EXTRA_THERE = Visible(2)
NO_EXTRA = Visible(0, "cuda-python is not installed", "cuda-python (cuda.bindings)")
NO_DRIVER = Visible(0, "cudaErrorInsufficientDriver")


def test_cpu_is_always_available() -> None:
    assert detect_device("cpu").kind == "cpu"


def test_auto_matches_what_the_cuda_runtime_reports() -> None:
    expected = "cuda" if cuda_device_count() > 0 else "cpu"
    assert detect_device("auto").kind == expected


def test_asking_for_cuda_without_one_is_refused_in_one_line() -> None:
    if cuda_device_count() > 0:
        pytest.skip("a CUDA device is present")
    with pytest.raises(DeviceRefused) as refused:
        detect_device("cuda")
    assert "\n" not in refused.value.message and "--device cuda" in refused.value.message


@pytest.mark.parametrize(
    ("text", "choice"),
    [
        ("auto", DeviceChoice("auto")),
        ("cpu", DeviceChoice("cpu")),
        ("cuda", DeviceChoice("cuda")),
        ("cuda:1,cuda:3", DeviceChoice("cuda", (1, 3))),
        (" cuda:0 ", DeviceChoice("cuda", (0,))),
    ],
)
def test_device_lists_parse(text: str, choice: DeviceChoice) -> None:
    assert parse_device(text) == choice
    assert parse_device(str(choice)) == choice  # and print back as given


@pytest.mark.parametrize("text", ["tpu", "cuda:", "cuda:x", "cpu,cuda:0", "cuda:1,cuda:1", ""])
def test_bad_device_lists_name_the_setting(text: str) -> None:
    with pytest.raises(ValueError, match=r"^device: "):
        parse_device(text)


def test_cuda_uses_every_visible_gpu_or_those_listed() -> None:
    assert resolve(DeviceChoice("cuda"), GPU_EXTRA_THERE) == [Device("cuda", 0), Device("cuda", 1)]
    assert resolve(parse_device("cuda:1"), GPU_EXTRA_THERE) == [Device("cuda", 1)]
    assert resolve(DeviceChoice("cpu"), GPU_EXTRA_THERE) == [Device("cpu")]


def test_auto_takes_every_gpu_when_the_extra_is_there_and_the_cpu_otherwise() -> None:
    assert resolve(DeviceChoice("auto"), GPU_EXTRA_THERE) == [Device("cuda", 0), Device("cuda", 1)]
    assert resolve(DeviceChoice("auto"), NO_EXTRA) == [Device("cpu")]
    assert resolve(DeviceChoice("auto"), NO_DRIVER) == [Device("cpu")]
    assert resolve(DeviceChoice("auto"), Visible(1, "", "nvidia-ml-py (pynvml)")) == [Device("cpu")]
    chose = describe_choice(DeviceChoice("auto"), [Device("cpu")])
    assert chose == "--device auto chose cpu"


def test_cuda_without_the_extra_is_refused_naming_the_extra() -> None:
    with pytest.raises(DeviceRefused) as refused:
        resolve(DeviceChoice("cuda"), NO_EXTRA)
    message = refused.value.message
    assert "fnrt[gpu]" in message and "cuda-python" in message and "[gpu]'" in message
    assert "\n" not in message


def test_cuda_with_no_gpu_visible_is_refused_naming_the_cause() -> None:
    with pytest.raises(DeviceRefused, match=r"no CUDA device is visible.*cudaErrorInsufficient"):
        resolve(DeviceChoice("cuda"), NO_DRIVER)


def test_a_listed_gpu_that_is_not_visible_is_refused_naming_it() -> None:
    with pytest.raises(DeviceRefused, match=r"cuda:3 is not visible \(2 GPUs visible"):
        resolve(parse_device("cuda:1,cuda:3"), GPU_EXTRA_THERE)


def test_what_a_worker_holds_besides_its_tensors_is_counted() -> None:
    assert context_cost(process_bytes=900 << 20, handler_bytes=400 << 20) == 500 << 20
    assert context_cost(process_bytes=100, handler_bytes=400) == 0  # never negative
    # the CPU twin: nothing on a device, nothing measured (and no CUDA touched)
    assert free_bytes_now(Device("cpu")) is None
    assert process_device_bytes(Device("cpu"), None) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("device", ["cuda", "cuda:0,cuda:1"])
def test_serve_on_a_gpu_it_cannot_have_exits_with_one_line(tmp_path: Path, device: str) -> None:
    """The real ``fnrt serve``: was a 31-line traceback ending in RuntimeError."""
    if cuda_device_count() > 0:
        pytest.skip("a CUDA device is present")
    argv = [sys.executable, "-m", "fnrt.runtime.cli.main", "serve", "--device", device]
    argv += ["--port", str(_free_port()), "--store", str(tmp_path / "store")]
    argv += ["--cache-dir", str(tmp_path / "cache")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: --device {device}: ")
    assert "fnrt[gpu]" in lines[0] or "no CUDA device is visible" in lines[0]


def test_serve_on_auto_says_which_device_it_chose(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "fnrt.runtime.cli.main", "serve", "--device", "auto"]
    argv += ["--port", str(_free_port()), "--store", str(tmp_path / "store")]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--log-level", "warning"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # the start-up line comes before anything is served
    finally:
        proc.terminate()
        proc.wait(30)
    expected = "cuda:0" if cuda_device_count() > 0 else "cpu"
    assert line.startswith("fnrt: serving store ")
    assert f"instances on --device auto chose {expected}" in line


@pytest.mark.gpu
def test_cuda_device_has_cuda_providers() -> None:
    device = detect_device("cuda")
    assert device.torch == "cuda:0"
    assert device.onnx_providers[0][0] == "CUDAExecutionProvider"
