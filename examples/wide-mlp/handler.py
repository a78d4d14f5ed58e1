"""The ``wide-mlp`` example's handler: ``forward`` on stacked tensors, weights mapped.

A handler with ``forward`` leaves batching's plumbing to fnrt: it stacks the
requests' rows into reusable buffers (page-locked on a GPU), copies them to the
device on the instance's copy stream while the previous batch computes, runs
``forward`` on the instance's compute stream and splits the outputs per request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fnrt.functions import Artifact, Device, Handler

from .model import build


class WideMLP(Handler):
    def load(self, artifacts: Mapping[str, Artifact], device: Device) -> None:
        # on the CPU the mapped weights are assigned (no copy); on a GPU they are read
        # into device memory through a pinned ring (docs/gpu.md)
        self.model = artifacts["weights"].module(build, device)

    def forward(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"y": self.model(inputs["x"])}
