"""Where to split a model: the decision, as a pure function (after Neurosurgeon, ASPLOS 2017).

For a model with split points ``p1 .. pn`` there are ``n + 2`` splits. Split
``k`` runs segments ``0 .. k-1`` on the device, sends what crosses point
``k`` (the inputs at ``k = 0``), and runs segments ``k .. n`` on the server;
``k = n + 1`` runs everything on the device and sends nothing. Its latency::

    device(k) + rtt + (sent(k) + result) / bandwidth + server_wait + server(k)

where ``device(k)`` sums the device's first ``k`` segments and ``server(k)``
the server's segments from ``k`` on. The plan is the split with the least.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    """What a plan is made from, besides the link.

    ``device_ms`` and ``server_ms`` hold one time per segment (``n + 1``);
    ``sent_bytes`` what crosses the network for splits ``0 .. n``.
    """

    device_ms: tuple[float, ...]
    server_ms: tuple[float, ...]
    sent_bytes: tuple[int, ...]
    result_bytes: int = 0
    server_wait_ms: float = 0.0

    def __post_init__(self) -> None:
        segments = len(self.server_ms)
        if segments < 1:
            raise ValueError("server_ms: needs one time per segment")
        if len(self.device_ms) != segments:
            raise ValueError(f"device_ms: needs {segments} segment times like server_ms")
        if len(self.sent_bytes) != segments:
            raise ValueError(f"sent_bytes: needs {segments} sizes (splits 0 to n)")
        for name in ("device_ms", "server_ms", "sent_bytes"):
            if any(not v >= 0 for v in getattr(self, name)):
                raise ValueError(f"{name}: values must be >= 0")
        if self.result_bytes < 0 or not self.server_wait_ms >= 0:
            raise ValueError("result_bytes and server_wait_ms must be >= 0")

    @property
    def splits(self) -> int:
        """How many splits there are (``n + 2``)."""
        return len(self.server_ms) + 1


@dataclass(frozen=True)
class Link:
    """The network between device and server, as last estimated."""

    bandwidth_bytes_per_s: float
    rtt_ms: float

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0:
            raise ValueError("bandwidth_bytes_per_s: must be > 0")
        if not self.rtt_ms >= 0:
            raise ValueError("rtt_ms: must be >= 0")

    def transfer_ms(self, size_bytes: int) -> float:
        return size_bytes / self.bandwidth_bytes_per_s * 1000.0


@dataclass(frozen=True)
class Plan:
    """The chosen split and the predicted latency of every split (inf: not allowed)."""

    split: int
    predicted_ms: tuple[float, ...]

    @property
    def latency_ms(self) -> float:
        return self.predicted_ms[self.split]


def predict(profile: Profile, link: Link) -> list[float]:
    """The predicted end-to-end latency (ms) of each split ``0 .. n + 1``."""
    out = []
    last = profile.splits - 1
    for k in range(profile.splits):
        device = sum(profile.device_ms[:k])
        if k == last:
            out.append(device)
            continue
        network = link.rtt_ms + link.transfer_ms(profile.sent_bytes[k] + profile.result_bytes)
        out.append(device + network + profile.server_wait_ms + sum(profile.server_ms[k:]))
    return out


def choose_split(profile: Profile, link: Link, allowed: Collection[int] | None = None) -> Plan:
    """The split with the least predicted latency among ``allowed`` (every split if None).

    On a tie the split sending the fewest bytes wins (then the lowest k).
    """
    predicted = predict(profile, link)
    if allowed is not None:
        predicted = [t if k in allowed else math.inf for k, t in enumerate(predicted)]
    last = profile.splits - 1

    def sent(k: int) -> int:
        return 0 if k == last else profile.sent_bytes[k]

    best = min(range(profile.splits), key=lambda k: (round(predicted[k], 6), sent(k), k))
    if math.isinf(predicted[best]):
        raise ValueError("no split is allowed")
    return Plan(best, tuple(predicted))
