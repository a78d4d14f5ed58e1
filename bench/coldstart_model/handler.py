"""The cold-start benchmark's model: a wide MLP whose weights are mapped, not read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fnrt.functions import Artifact, Device, Request, Result

from .net import build


class Wide:
    def load(self, artifacts: Mapping[str, Artifact], device: Device) -> None:
        with torch.device("meta"):  # no random init: the weights come from the file
            self.net = build()
        self.net.load_state_dict(artifacts["weights"].tensors(device), assign=True)
        self.net.eval()

    def __call__(self, batch: list[Request]) -> Sequence[Result]:
        x = torch.from_numpy(np.concatenate([r["x"] for r in batch]))
        with torch.inference_mode():
            y: Any = self.net(x).numpy()
        return [{"y": y[i : i + 1]} for i in range(len(batch))]
