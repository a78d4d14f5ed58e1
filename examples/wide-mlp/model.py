"""The ``wide-mlp`` example: 256 inputs, two 2048-wide hidden layers, 16 outputs.

Wide enough that one request's matrix-vector products are bound by reading the
weights (~19 MB), so a batch of 32 costs little more than a batch of 1: the
example where batching pays.
"""

from __future__ import annotations

import torch
from torch import nn

IN_FEATURES = 256
HIDDEN = 2048
OUT_FEATURES = 16


def build() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, OUT_FEATURES),
    )


def seeded(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return build().eval()
