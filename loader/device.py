"""Choosing the devices once per process, without asking libraries that guess.

onnxruntime-gpu lists CUDA even where no driver exists, and torch may be a CPU
build; the CUDA runtime's own device count (through cuda-python) is the one
answer that holds everywhere: ``cudaErrorInsufficientDriver`` or no device
means the CPU path.

``--device`` is ``auto``, ``cpu``, ``cuda`` (every visible GPU) or a list of
GPUs (``cuda:1,cuda:3``). :func:`resolve` is the pure decision, from what the
machine has (how many GPUs are visible, whether the GPU extra is installed);
asked for a GPU it cannot have, the node is refused at start with one line
(:class:`DeviceRefused`) naming the extra or the cause.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from fnrt.functions.errors import FnrtError
from fnrt.functions.extras import install_command
from fnrt.functions.handler import Device

Preference = Literal["auto", "cpu", "cuda"]


class DeviceRefused(FnrtError):
    """``--device`` asks for a GPU this machine cannot give: one line saying why."""


@dataclass(frozen=True)
class DeviceChoice:
    """What ``--device`` asked for: ``kind``, and for ``cuda`` the GPUs (() = every visible)."""

    kind: Preference = "auto"
    indices: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device: {self.kind!r} is not auto, cpu or cuda")
        if self.indices and self.kind != "cuda":
            raise ValueError("device: only cuda takes device numbers (cuda:0,cuda:1)")
        if any(i < 0 for i in self.indices) or len(set(self.indices)) != len(self.indices):
            raise ValueError(f"device: {self.indices} must be distinct numbers >= 0")

    def __str__(self) -> str:
        if not self.indices:
            return self.kind
        return ",".join(f"cuda:{i}" for i in self.indices)


def parse_device(text: str) -> DeviceChoice:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:1,cuda:3``; ValueError naming ``device``."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if len(parts) == 1 and parts[0] in ("auto", "cpu", "cuda"):
        return DeviceChoice(parts[0])  # type: ignore[arg-type]
    indices = []
    for part in parts:
        kind, colon, number = part.partition(":")
        if kind != "cuda" or not colon or not number.isdigit():
            raise ValueError(
                f"device: {text!r} is not auto, cpu, cuda or a list like cuda:0,cuda:1"
            )
        indices.append(int(number))
    if not indices:
        raise ValueError("device: empty")
    return DeviceChoice("cuda", tuple(indices))


@dataclass(frozen=True)
class Visible:
    """What this machine offers: GPUs visible to the CUDA runtime, why none are (the
    runtime's error name, or that cuda-python is missing), and the missing module of
    the GPU extra, if any."""

    count: int
    cause: str = ""
    extra_missing: str | None = None


def resolve(choice: DeviceChoice, visible: Visible) -> list[Device]:
    """The devices instances run on (pure): ``cpu``, every visible GPU for ``cuda`` (or
    those listed), ``auto`` every visible GPU when the GPU extra is there, else the CPU.
    DeviceRefused, one line, when ``cuda`` cannot be had."""
    if choice.kind == "cpu":
        return [Device("cpu")]
    usable = visible.count if visible.extra_missing is None else 0
    if choice.kind == "auto":
        return [Device("cuda", i) for i in range(usable)] or [Device("cpu")]
    if visible.extra_missing is not None:
        raise DeviceRefused(
            f"--device {choice}: the GPU extra fnrt[gpu] is not installed "
            f"({visible.extra_missing} is missing): {install_command('gpu')}"
        )
    if not visible.count:
        raise DeviceRefused(
            f"--device {choice}: no CUDA device is visible"
            f"{f' ({visible.cause})' if visible.cause else ''}; "
            "check the driver (nvidia-smi), CUDA_VISIBLE_DEVICES, or the pod's nvidia.com/gpu"
        )
    wanted = choice.indices or tuple(range(visible.count))
    missing = [i for i in wanted if i >= visible.count]
    if missing:
        raise DeviceRefused(
            f"--device {choice}: cuda:{missing[0]} is not visible "
            f"({visible.count} GPU{'s' if visible.count != 1 else ''} visible: "
            f"cuda:0..cuda:{visible.count - 1})"
        )
    return [Device("cuda", i) for i in wanted]


def describe_choice(choice: DeviceChoice, devices: Sequence[Device]) -> str:
    """The start-up line's words for the devices chosen: what ``auto`` chose, and why."""
    names = ", ".join(str(d) for d in devices)
    if choice.kind == "auto":
        return f"--device auto chose {names}"
    return f"devices: {names}"


def visible() -> Visible:
    """What this machine offers (:class:`Visible`); no CUDA context is made."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return Visible(0, "cuda-python is not installed", "cuda-python (cuda.bindings)")
    try:
        import pynvml  # noqa: F401  # the GPU extra's other half: device memory, /metrics
    except ImportError:
        missing: str | None = "nvidia-ml-py (pynvml)"
    else:
        missing = None
    try:
        err, count = cudart.cudaGetDeviceCount()
    except Exception as exc:  # a broken driver install
        return Visible(0, f"cudaGetDeviceCount raised {exc}", missing)
    if err != cudart.cudaError_t.cudaSuccess:
        _, name = cudart.cudaGetErrorName(err)
        return Visible(0, name.decode() if isinstance(name, bytes) else str(name), missing)
    return Visible(int(count), "" if count else "cudaGetDeviceCount found 0", missing)


def cuda_device_count() -> int:
    """Visible CUDA devices; 0 when there is no driver, device or cuda-python."""
    return visible().count


def device_memory_bytes(index: int = 0) -> int:
    """CUDA device ``index``'s memory in bytes (its properties: no context is made)."""
    from cuda.bindings import runtime as cudart

    err, properties = cudart.cudaGetDeviceProperties(index)
    if err != cudart.cudaError_t.cudaSuccess:
        raise RuntimeError(f"CUDA device {index}: cudaGetDeviceProperties failed ({err})")
    return int(properties.totalGlobalMem)


@functools.cache
def choose_devices(text: str) -> list[Device]:
    """The devices ``--device text`` gives on this machine (DeviceRefused: it cannot)."""
    return resolve(parse_device(text), visible())


@functools.cache
def detect_device(preference: Preference = "auto", index: int = 0) -> Device:
    """One device: CUDA ``index`` if asked or available, else the CPU (DeviceRefused
    when ``cuda`` was asked and cannot be had)."""
    if preference == "cpu":
        return Device("cpu")
    choice = DeviceChoice("cuda", (index,)) if preference == "cuda" else DeviceChoice("auto")
    devices = resolve(choice, visible())
    return next((d for d in devices if d.index == index), devices[0])


# --- what a worker's CUDA context costs --------------------------------------------------


def context_cost(process_bytes: int, handler_bytes: int) -> int:
    """The bytes a process holds on a device that its handler's tensors do not account
    for (pure): its CUDA context, cuBLAS's workspace, the staging buffers, torch's cache;
    what the GPU budget must count besides the tensors. Never below 0."""
    return max(process_bytes - handler_bytes, 0)


def free_bytes_now(device: Device) -> int | None:
    """The device's free memory without making a CUDA context (NVML); None on the CPU
    or without NVML. What a worker reads before it first touches the GPU."""
    if device.kind != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).free)
    except Exception:  # no NVML: the difference below is all there is
        return None


def process_device_bytes(device: Device, free_before: int | None) -> int:
    """Device memory this process holds on ``device`` (0 on the CPU), measured: NVML's
    count for this pid when it sees it (not in every container's pid namespace), else
    the free memory before this process touched the GPU (:func:`free_bytes_now`) less
    ``cudaMemGetInfo``'s free now. Call it after the load, on the loading thread."""
    if device.kind != "cuda":
        return 0
    import os

    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory:
                return int(proc.usedGpuMemory)
    except Exception:  # no NVML, or not this pid: fall back to cudaMemGetInfo
        pass
    from cuda.bindings import runtime as cudart

    cudart.cudaSetDevice(device.index)
    err, free_now, _total = cudart.cudaMemGetInfo()
    if err != cudart.cudaError_t.cudaSuccess or free_before is None:
        return 0
    return max(free_before - int(free_now), 0)
