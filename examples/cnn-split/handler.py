"""The ``cnn-split`` example: a small CNN run by onnxruntime, split-capable.

Invoked whole like any function; edge devices run its first layers and send
the activation to ``/v1/functions/cnn-split/split/{k}`` (see docs/edge.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fnrt.functions import Artifact, Device, Handler, Request, Result


class CNN(Handler):
    def load(self, artifacts: Mapping[str, Artifact], device: Device) -> None:
        self.session = artifacts["model"].onnx_session(device)

    def __call__(self, batch: list[Request]) -> Sequence[Result]:
        sizes = [len(r["x"]) for r in batch]
        (y,) = self.session.run(["y"], {"x": np.concatenate([r["x"] for r in batch])})
        return [{"y": part} for part in np.split(y, np.cumsum(sizes)[:-1])]
