"""The ``cnn-split`` network: a small image classifier as one ``nn.Sequential``.

Its layer boundaries go from early and large (16x32x32 floats, 64 KiB a row)
to late and small (64 floats): where to cut depends on the link.
"""

from __future__ import annotations

from typing import Any

IMAGE_SHAPE = (3, 32, 32)
CLASSES = 10


def build() -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),  # 0
        nn.ReLU(),  # 1  -> after.1: 16x32x32
        nn.MaxPool2d(2),  # 2  -> after.2: 16x16x16
        nn.Conv2d(16, 64, 3, padding=1),  # 3
        nn.ReLU(),  # 4  -> after.4: 64x16x16
        nn.MaxPool2d(2),  # 5  -> after.5: 64x8x8
        nn.Conv2d(64, 128, 3, padding=1),  # 6
        nn.ReLU(),  # 7
        nn.MaxPool2d(2),  # 8  -> after.8: 128x4x4
        nn.Conv2d(128, 64, 3, padding=1),  # 9
        nn.ReLU(),  # 10
        nn.AdaptiveAvgPool2d(1),  # 11
        nn.Flatten(),  # 12 -> after.12: 64
        nn.Linear(64, CLASSES),  # 13
    )
