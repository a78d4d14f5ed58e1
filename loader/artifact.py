"""Artifacts as a handler's ``load`` receives them: local paths plus format helpers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from fnrt.functions.handler import Device
from fnrt.loader.formats import onnx as onnx_format
from fnrt.loader.formats import safetensors as safetensors_format
from fnrt.loader.formats import torch as torch_format
from fnrt.loader.transfer import safetensors_to_device

M = TypeVar("M")


def _device_str(device: Device | str) -> str:
    return device.torch if isinstance(device, Device) else device


def _as_device(device: Device | str) -> Device:
    if isinstance(device, Device):
        return device
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r} is neither 'cpu' nor 'cuda[:N]'")
    return Device("cuda", int(index or 0)) if kind == "cuda" else Device("cpu")


@dataclass(frozen=True)
class LocalArtifact:
    """An artifact on this machine's disk (implements ``fnrt.functions.Artifact``)."""

    name: str
    path: Path
    digest: str
    size_bytes: int
    device: Device

    def tensors(self, device: Device | str | None = None) -> dict[str, Any]:
        """Views of the mapped file on the CPU; on a GPU, one device allocation filled by
        parallel reads through a pinned ring (``transfer.py``), each tensor a view of it."""
        target = _as_device(device or self.device)
        if target.kind == "cuda":
            return safetensors_to_device(self.path, target)
        return safetensors_format.tensors(self.path, "cpu")

    def arrays(self) -> dict[str, np.ndarray[Any, Any]]:
        return safetensors_format.arrays(self.path)

    def state_dict(
        self, device: Device | str | None = None, *, trust_pickle: bool = False
    ) -> dict[str, Any]:
        return torch_format.state_dict(
            self.path, _device_str(device or self.device), trust_pickle=trust_pickle
        )

    def onnx_session(self, device: Device | None = None, **options: Any) -> Any:
        return onnx_format.session(self.path, (device or self.device).onnx_providers, **options)

    def module(
        self, build: Callable[[], M], device: Device | str | None = None, *, strict: bool = True
    ) -> M:
        """``build()`` on the ``meta`` device with this artifact's weights (safetensors,
        or a torch checkpoint) assigned, mapped and not copied: the cold-start floor."""
        with self.path.open("rb") as f:
            checkpoint = f.read(4) == b"PK\x03\x04"  # torch.save's zip; else safetensors
        weights = self.state_dict(device) if checkpoint else self.tensors(device)
        return torch_format.mapped_module(build, weights, strict=strict)
