"""The ``wide-mlp`` example's handler: one forward pass per batch, weights mapped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fnrt.functions import Artifact, Device, Handler, Request, Result

from .model import build


class WideMLP(Handler):
    def load(self, artifacts: Mapping[str, Artifact], device: Device) -> None:
        self.device = device.torch
        # built on the meta device, the mapped weights assigned: no random init, no copy
        self.model = artifacts["weights"].module(build, device)

    def __call__(self, batch: list[Request]) -> Sequence[Result]:
        sizes = [len(r["x"]) for r in batch]
        x = torch.from_numpy(np.concatenate([r["x"] for r in batch]))
        with torch.inference_mode():
            y: Any = self.model(x.to(self.device)).cpu().numpy()
        return [{"y": part} for part in np.split(y, np.cumsum(sizes)[:-1])]
