"""How a connection writes: header lines, and an answer's writes held to the turn's end."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fnrt.runtime.http.answering import OneWrite, header_lines


def test_header_lines_refuse_a_value_with_a_line_break() -> None:
    assert header_lines([(b"x-a", b"1"), (b"x-b", b"two")]) == b"x-a: 1\r\nx-b: two\r\n"
    with pytest.raises(ValueError, match="x-b"):
        header_lines([(b"x-b", b"two\r\nset-cookie: evil")])


class Recorded(asyncio.Transport):
    """A transport that records what reaches it, one entry a call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Any] = []
        self.closed = False

    def writelines(self, data: Any) -> None:
        self.calls.append(list(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0


def test_writes_of_one_turn_leave_in_one_call_at_its_end() -> None:
    async def main() -> tuple[list[Any], list[Any], int]:
        transport = Recorded()
        one = OneWrite(transport, asyncio.get_running_loop())
        one.write(b"head")
        one.write(b"body")
        during = list(transport.calls)  # nothing yet: the turn has not ended
        await asyncio.sleep(0)
        return during, transport.calls, one.written

    during, after, written = asyncio.run(main())
    assert during == [] and after == [[b"head", b"body"]] and written == 8


def test_a_close_sends_what_is_held_first() -> None:
    async def main() -> Recorded:
        transport = Recorded()
        one = OneWrite(transport, asyncio.get_running_loop())
        one.write(b"answer")
        one.close()
        await asyncio.sleep(0)  # the flush scheduled for the turn's end finds nothing more
        return transport

    transport = asyncio.run(main())
    assert transport.calls == [[b"answer"]] and transport.closed
