"""The OTLP collector the tracing tests export to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support import OtlpCollector, otlp_collector


@pytest.fixture
def collector() -> Iterator[OtlpCollector]:
    with otlp_collector() as running:
        yield running
