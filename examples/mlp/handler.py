"""The ``mlp`` example: a torch MLP whose weights are mapped from safetensors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fnrt.functions import Artifact, Device, Handler, Request, Result

from .model import MLP


class MLPHandler(Handler):
    def load(self, artifacts: Mapping[str, Artifact], device: Device) -> None:
        self.device = device.torch
        self.model = MLP()
        # assign=True keeps the mapped tensors as the parameters: no copy on CPU.
        self.model.load_state_dict(artifacts["weights"].tensors(device), assign=True)
        self.model.eval()

    def __call__(self, batch: list[Request]) -> Sequence[Result]:
        xs = [r["x"] for r in batch]
        x = torch.from_numpy(np.concatenate(xs))  # a copy of its own, writable
        with torch.inference_mode():
            y: Any = self.model(x.to(self.device)).cpu().numpy()
        return [{"y": part} for part in rows_of(y, xs)]


def rows_of(y: Any, xs: list[Any]) -> list[Any]:
    """``y`` cut into each request's rows, as many as its input had (slices: no copy)."""
    parts, at = [], 0
    for x in xs:
        parts.append(y[at : at + len(x)])
        at += len(x)
    return parts
