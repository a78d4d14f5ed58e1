"""What an invoke returns: the outputs, and who answered."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, eq=False)  # outputs are arrays: no field-wise ==
class Result(Mapping[str, Any]):
    """The outputs by name (numpy arrays over msgpack; lists over JSON), and who served them.

    A Result is a read-only mapping of its outputs: ``result["y"]``.
    """

    outputs: dict[str, Any]
    function: str
    version: str  # the version that answered
    cold_start: str | None = None  # "l2" or "l3" when the call waited for a load
    cache_hit: bool = False  # answered from the function's result cache
    fallback: str | None = None  # "cache" or "function:NAME" when its breaker was open
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __getitem__(self, name: str) -> Any:
        return self.outputs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)
