"""A wide MLP: ``LAYERS`` Linear(WIDTH, WIDTH) layers, 4 * WIDTH^2 * LAYERS bytes of float32."""

from __future__ import annotations

from torch import nn

WIDTH = 2048
LAYERS = 16  # 16 x 16 MiB = 256 MiB of weights


def build(width: int = WIDTH, layers: int = LAYERS) -> nn.Sequential:
    parts: list[nn.Module] = []
    for _ in range(layers):
        parts += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*parts[:-1])
