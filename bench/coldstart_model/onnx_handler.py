"""The ONNX variant of the cold-start model, run by onnxruntime from the cached file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fnrt.functions import Artifact, Device, Request, Result


class WideOnnx:
    def load(self, artifacts: Mapping[str, Artifact], device: Device) -> None:
        self.session = artifacts["model"].onnx_session(device)

    def __call__(self, batch: list[Request]) -> Sequence[Result]:
        (y,) = self.session.run(None, {"x": np.concatenate([r["x"] for r in batch])})
        return [{"y": y[i : i + 1]} for i in range(len(batch))]
