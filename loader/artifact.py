"""Artifacts as a handler's ``load`` receives them: local paths plus format helpers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fnrt.functions.handler import Device
from fnrt.loader.formats import onnx as onnx_format
from fnrt.loader.formats import safetensors as safetensors_format
from fnrt.loader.formats import torch as torch_format


def _device_str(device: Device | str) -> str:
    return device.torch if isinstance(device, Device) else device


@dataclass(frozen=True)
class LocalArtifact:
    """An artifact on this machine's disk (implements ``fnrt.functions.Artifact``)."""

    name: str
    path: Path
    digest: str
    size_bytes: int
    device: Device

    def tensors(self, device: Device | str | None = None) -> dict[str, Any]:
        return safetensors_format.tensors(self.path, _device_str(device or self.device))

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
