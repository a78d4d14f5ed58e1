"""The ``cnn-split`` network: a small image classifier as one ``nn.Sequential``.

Shaped like the models split inference pays for: cheap early layers whose
outputs are large (``after.1``: 16x32x32 floats, 64 KiB a row), a bottleneck
(``after.5``: 8x8x8, 2 KiB, smaller than the 12 KiB image), then the heavy
layers, and a small vector at the end (``after.14``: 256 floats).
"""

from __future__ import annotations

from typing import Any

IMAGE_SHAPE = (3, 32, 32)
CLASSES = 10


def build() -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),  # 0
        nn.ReLU(),  # 1   after.1: 16x32x32
        nn.MaxPool2d(2),  # 2   after.2: 16x16x16
        nn.Conv2d(16, 8, 1),  # 3
        nn.ReLU(),  # 4
        nn.MaxPool2d(2),  # 5   after.5: 8x8x8 (the bottleneck)
        nn.Conv2d(8, 128, 3, padding=1),  # 6
        nn.ReLU(),  # 7   after.7: 128x8x8
        nn.Conv2d(128, 128, 3, padding=1),  # 8
        nn.ReLU(),  # 9
        nn.MaxPool2d(2),  # 10  after.10: 128x4x4
        nn.Conv2d(128, 256, 3, padding=1),  # 11
        nn.ReLU(),  # 12
        nn.AdaptiveAvgPool2d(1),  # 13
        nn.Flatten(),  # 14  after.14: 256
        nn.Linear(256, 256),  # 15
        nn.ReLU(),  # 16
        nn.Linear(256, CLASSES),  # 17
    )
