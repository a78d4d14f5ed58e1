"""Choosing the device once per process, without asking libraries that guess.

onnxruntime-gpu lists CUDA even where no driver exists, and torch may be a CPU
build; the CUDA runtime's own device count (through cuda-python) is the one
answer that holds everywhere: ``cudaErrorInsufficientDriver`` or no device
means the CPU path.
"""

from __future__ import annotations

import functools
from typing import Literal

from fnrt.functions.handler import Device

Preference = Literal["auto", "cpu", "cuda"]


def cuda_device_count() -> int:
    """Visible CUDA devices; 0 when there is no driver, device or cuda-python."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return 0
    try:
        err, count = cudart.cudaGetDeviceCount()
    except Exception:
        return 0
    return int(count) if err == cudart.cudaError_t.cudaSuccess and count else 0


def device_memory_bytes(index: int = 0) -> int:
    """CUDA device ``index``'s memory in bytes (its properties: no context is made)."""
    from cuda.bindings import runtime as cudart

    err, properties = cudart.cudaGetDeviceProperties(index)
    if err != cudart.cudaError_t.cudaSuccess:
        raise RuntimeError(f"CUDA device {index}: cudaGetDeviceProperties failed ({err})")
    return int(properties.totalGlobalMem)


@functools.cache
def detect_device(preference: Preference = "auto", index: int = 0) -> Device:
    """The device instances run on: CUDA ``index`` if asked or available, else CPU."""
    if preference == "cpu":
        return Device("cpu")
    count = cuda_device_count()
    if count > index:
        return Device("cuda", index)
    if preference == "cuda":
        raise RuntimeError(f"CUDA device {index} was asked for, but {count} are visible")
    return Device("cpu")
