from __future__ import annotations

import pytest

from fnrt.loader.device import cuda_device_count, detect_device


def test_cpu_is_always_available() -> None:
    assert detect_device("cpu").kind == "cpu"


def test_auto_matches_what_the_cuda_runtime_reports() -> None:
    expected = "cuda" if cuda_device_count() > 0 else "cpu"
    assert detect_device("auto").kind == expected


def test_asking_for_cuda_without_one_is_an_error() -> None:
    if cuda_device_count() > 0:
        pytest.skip("a CUDA device is present")
    with pytest.raises(RuntimeError, match="CUDA device 0 was asked for"):
        detect_device("cuda")


@pytest.mark.gpu
def test_cuda_device_has_cuda_providers() -> None:
    device = detect_device("cuda")
    assert device.torch == "cuda:0"
    assert device.onnx_providers[0][0] == "CUDAExecutionProvider"
