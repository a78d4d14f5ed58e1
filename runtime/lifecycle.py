"""Where a node is in its life, as ``/readyz`` and the connections see it.

``starting``: reading the store and warming the functions that load at start
(``/readyz`` 503); ``ready``; ``draining``: a stop signal arrived, ``/readyz``
answers 503 at once so endpoints drop the node, it keeps serving for
``--drain-delay-s`` while they do, answers with ``Connection: close`` so
clients reconnect elsewhere, then stops accepting and finishes what it
accepted; ``stopped``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from enum import Enum

log = logging.getLogger("fnrt.node")


class Phase(Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass
class Lifecycle:
    """The node's phase, and the start-up warming ``/readyz`` waits for."""

    phase: Phase = Phase.STARTING
    warming: set[asyncio.Future[None]] = field(default_factory=set)
    #: draining or stopped: read by every request (a field, not a property: no call)
    draining: bool = field(default=False, init=False)

    def started(self) -> None:
        if self.phase is Phase.STARTING:
            self.phase = Phase.READY

    def drain(self) -> None:
        """A stop was asked for: no longer ready, from now on."""
        if self.phase is not Phase.STOPPED:
            if self.phase is not Phase.DRAINING:
                log.info("draining: /readyz answers 503 from now on")
            self.phase = Phase.DRAINING
            self.draining = True

    def stopped(self) -> None:
        self.phase = Phase.STOPPED
        self.draining = True

    def still_warming(self) -> int:
        """Functions that load at start and have not finished their first load
        (warm, or failed: one broken function must not keep a node unready)."""
        self.warming = {f for f in self.warming if not f.done()}
        return len(self.warming)
