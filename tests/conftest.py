from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import support


@pytest.fixture(autouse=True)
def _fresh_gates() -> Iterator[None]:
    support.reset_gates()
    yield
    for event in support.gates.events.values():  # type: ignore[attr-defined]
        event.set()  # never leave a handler thread blocked


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from fnrt.loader.device import cuda_device_count

    if cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
