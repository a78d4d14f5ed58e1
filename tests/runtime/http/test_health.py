"""``/readyz``'s decision (``not_ready``) on a fake node: no server."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from fnrt.runtime.http.health import not_ready
from fnrt.runtime.lifecycle import Phase


class _Node:
    """What ``not_ready`` reads of a node: its lifecycle, its store, the feed's check
    (which answers when the test says)."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lifecycle = SimpleNamespace(draining=False, phase=Phase.READY, still_warming=lambda: 0)
        self.lifecycle = lifecycle
        self.repository = SimpleNamespace(store=SimpleNamespace(uri="file:///store"))
        self.registry = SimpleNamespace(feed=SimpleNamespace(store_answers=self._answers))

    async def _answers(self) -> None:
        await self.answer


def _request(node: _Node) -> Any:
    return cast(Any, SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(node=node))))


def test_ready_once_the_store_answers_and_unavailable_when_it_fails() -> None:
    async def scenario() -> None:
        node = _Node()
        probe = asyncio.ensure_future(not_ready(_request(node)))
        await asyncio.sleep(0)
        node.answer.set_result(None)
        assert await probe is None

        node = _Node()
        node.answer.set_exception(OSError("no route to the store"))
        status, why = await not_ready(_request(node)) or ("", "")
        assert status == "unavailable" and "no route to the store" in why

    asyncio.run(scenario())


def test_a_probe_cancelled_as_the_store_answers_is_cancelled() -> None:
    """A readiness probe cancelled in the same turn as the store's check ends (the client
    gone, the node stopping) is cancelled: on Python 3.11 ``asyncio.wait_for`` returned
    instead and the cancel was lost."""

    async def scenario() -> None:
        node = _Node()
        probe = asyncio.ensure_future(not_ready(_request(node)))
        for _ in range(3):
            await asyncio.sleep(0)  # it awaits the check
        check = next(iter(asyncio.all_tasks() - {probe, asyncio.current_task()}))
        check.add_done_callback(lambda _: probe.cancel())  # as it ends
        node.answer.set_result(None)
        with pytest.raises(asyncio.CancelledError):
            await probe

    asyncio.run(scenario())


def test_the_stores_own_timeout_is_its_reason_not_the_probes() -> None:
    """A store whose client timed out (its own read timeout, well within the probe's 5 s)
    is reported with that reason, not as "no answer within 5 s"."""

    async def scenario() -> None:
        node = _Node()
        node.answer.set_exception(TimeoutError("read timeout on the store's endpoint"))
        status, why = await not_ready(_request(node)) or ("", "")
        assert status == "unavailable" and "read timeout on the store's endpoint" in why

    asyncio.run(scenario())
