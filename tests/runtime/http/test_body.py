"""Reading a request body within its limit and its deadline, on a fake ASGI receive."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fnrt.functions.errors import BodyTimeout, PayloadTooLarge
from fnrt.runtime.http.body import read_body


class Chunks:
    """An ASGI ``receive`` whose messages the test hands over one at a time."""

    def __init__(self) -> None:
        self.next: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    async def __call__(self) -> dict[str, Any]:
        message = await self.next
        self.next = asyncio.get_running_loop().create_future()
        return message

    def give(self, body: bytes, more: bool) -> None:
        self.next.set_result({"type": "http.request", "body": body, "more_body": more})


def test_a_body_in_chunks_is_read_whole_within_its_limit() -> None:
    async def scenario() -> None:
        receive = Chunks()
        reading = asyncio.ensure_future(read_body({}, receive, 10, timeout_s=5.0))
        for part, more in ((b"ab", True), (b"cd", True), (b"e", False)):
            receive.give(part, more)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        assert await reading == b"abcde"

        receive = Chunks()
        reading = asyncio.ensure_future(read_body({}, receive, 3, timeout_s=5.0))
        receive.give(b"abcd", True)
        with pytest.raises(PayloadTooLarge):
            await reading

    asyncio.run(scenario())


def test_a_body_stalled_past_its_deadline_is_refused() -> None:
    async def scenario() -> None:
        receive = Chunks()
        reading = asyncio.ensure_future(read_body({}, receive, 10, timeout_s=0.05))
        receive.give(b"ab", True)  # the first read waits on no timer; the next one does
        with pytest.raises(BodyTimeout):
            await reading

    asyncio.run(scenario())


def test_a_read_cancelled_as_its_chunk_comes_is_cancelled() -> None:
    """The request's task cancelled in the same turn as the next chunk arrives (the
    client gone, the node stopping) is cancelled: on Python 3.11 ``asyncio.wait_for``
    returned the chunk instead, and the request went on to be computed."""

    async def scenario() -> None:
        receive = Chunks()
        reading = asyncio.ensure_future(read_body({}, receive, 10, timeout_s=5.0))
        receive.give(b"ab", True)
        for _ in range(3):
            await asyncio.sleep(0)  # it awaits the second chunk, under its deadline
        receive.give(b"cd", False)
        reading.cancel()  # in the same turn
        with pytest.raises(asyncio.CancelledError):
            await reading

    asyncio.run(scenario())
