"""The network of the ``mlp`` example: 64 inputs, two hidden layers, 10 outputs."""

from __future__ import annotations

import torch
from torch import nn

IN_FEATURES = 64
HIDDEN = 128
OUT_FEATURES = 10


class MLP(nn.Sequential):
    def __init__(self) -> None:
        super().__init__(
            nn.Linear(IN_FEATURES, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, OUT_FEATURES),
        )


def build() -> MLP:
    return MLP()


def seeded_mlp(seed: int = 0) -> MLP:
    """The example's network with deterministic weights."""
    torch.manual_seed(seed)
    return MLP().eval()
