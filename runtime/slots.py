"""A pool's slot as the pool's parts read it.

:class:`~fnrt.runtime.pool.InstancePool` holds the slots and is the only one to
change them; its scaler (:mod:`fnrt.runtime.scaler`) and its file watches
(:mod:`fnrt.runtime.watches`) read them through this one view.
"""

from __future__ import annotations

from typing import Protocol

from fnrt.loader.instance import Runnable


class SlotView(Protocol):
    """A slot, read only: which it is, its instance, and whether and when it worked."""

    @property
    def index(self) -> int: ...
    @property
    def instance(self) -> Runnable | None: ...
    @property
    def running(self) -> bool: ...
    @property
    def last_active(self) -> float: ...
    @property
    def primary(self) -> bool: ...
