"""The control socket's framing, and reading a reply in the event loop's reader callback."""

from __future__ import annotations

import asyncio
import gc
import socket
import types

import msgpack
import pytest

from fnrt.loader.channel import READ_AHEAD_BYTES, Channel, ChannelClosed, Received


def _pair() -> tuple[Channel, socket.socket]:
    ours, theirs = socket.socketpair()
    return Channel(ours), theirs


def _frame(message: dict[str, object]) -> bytes:
    body: bytes = msgpack.packb(message, use_bin_type=True)
    return len(body).to_bytes(4, "little") + body


def test_read_soon_reads_one_message_in_pieces_and_leaves_the_next_in_the_socket() -> None:
    channel, theirs = _pair()
    first, second = _frame({"n": 1, "pad": "x" * 300}), _frame({"n": 2})

    async def scenario() -> list[Received]:
        loop = asyncio.get_running_loop()
        got: list[Received] = []
        arrived = asyncio.Event()

        def deliver(message: Received) -> None:
            got.append(message)
            arrived.set()

        channel.read_soon(loop, deliver)
        theirs.sendall(first[:2])  # half a header, then the rest in two pieces
        await asyncio.sleep(0.01)
        theirs.sendall(first[2:100])
        await asyncio.sleep(0.01)
        assert not got  # nothing is delivered before the whole message
        theirs.sendall(first[100:] + second)
        await arrived.wait()
        await asyncio.sleep(0.01)  # no second delivery: reading stopped after one
        return got

    try:
        got = asyncio.run(scenario())
        assert got == [{"n": 1, "pad": "x" * 300}]
        assert channel.recv(1.0) == {"n": 2}  # the next message is still there, whole
    finally:
        channel.close()
        theirs.close()


def test_a_reader_that_delivered_leaves_no_cycle_for_the_garbage_collector() -> None:
    # its ``stop`` and its reader held each other: a cycle a batch, freed only by the
    # collector (whose passes, on the event loop's thread, are a batch's latency)
    channel, theirs = _pair()

    async def scenario() -> list[object]:
        loop = asyncio.get_running_loop()
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for n in range(20):
                done: asyncio.Future[Received] = loop.create_future()
                stop = channel.read_soon(loop, done.set_result)
                theirs.sendall(_frame({"n": n}))
                assert await done == {"n": n}
                stop()  # as a batch's wait does when its reply came
                del stop, done
            gc.collect()
            return [
                o
                for o in gc.garbage
                if isinstance(o, types.FunctionType) and o.__module__ == Channel.__module__
            ]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()

    try:
        assert asyncio.run(scenario()) == []
    finally:
        channel.close()
        theirs.close()


def test_read_soon_delivers_channel_closed_when_the_other_end_goes() -> None:
    channel, theirs = _pair()

    async def scenario() -> Received:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Received] = loop.create_future()
        channel.read_soon(loop, done.set_result)
        theirs.sendall(_frame({"n": 1})[:3])
        theirs.close()
        return await done

    try:
        assert isinstance(asyncio.run(scenario()), ChannelClosed)
    finally:
        channel.close()


def test_read_soon_stopped_reads_nothing() -> None:
    channel, theirs = _pair()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        got: list[Received] = []
        stop = channel.read_soon(loop, got.append)
        stop()
        stop()  # twice is fine
        theirs.sendall(_frame({"n": 1}))
        await asyncio.sleep(0.02)
        assert not got

    try:
        asyncio.run(scenario())
        assert channel.recv(1.0) == {"n": 1}
    finally:
        channel.close()
        theirs.close()


@pytest.mark.parametrize("loop_factory", ["asyncio", "uvloop"])
def test_read_soon_on_either_loop(loop_factory: str) -> None:
    channel, theirs = _pair()

    async def scenario() -> Received:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Received] = loop.create_future()
        channel.read_soon(loop, done.set_result)
        theirs.sendall(_frame({"ok": True}))
        return await done

    try:
        if loop_factory == "uvloop":
            import uvloop

            got = uvloop.run(scenario())
        else:
            got = asyncio.run(scenario())
        assert got == {"ok": True}
    finally:
        channel.close()
        theirs.close()


def _counting(loop: asyncio.AbstractEventLoop) -> dict[str, int]:
    """Count the loop's add_reader and remove_reader calls (an asyncio loop's methods)."""
    counts = {"add_reader": 0, "remove_reader": 0}
    for name in counts:
        original = getattr(loop, name)

        def counted(*args: object, _original: object = original, _name: str = name) -> object:
            counts[_name] += 1
            return _original(*args)  # type: ignore[operator]

        setattr(loop, name, counted)
    return counts


def test_lone_replies_in_a_row_register_the_socket_with_the_loop_once() -> None:
    channel, theirs = _pair()

    async def scenario() -> tuple[list[Received], dict[str, int]]:
        loop = asyncio.get_running_loop()
        counts = _counting(loop)
        got: list[Received] = []
        for n in range(3):
            done: asyncio.Future[Received] = loop.create_future()
            channel.read_soon(loop, done.set_result)
            theirs.sendall(_frame({"n": n}))
            got.append(await done)
        return got, counts

    try:
        got, counts = asyncio.run(scenario())
        assert got == [{"n": 0}, {"n": 1}, {"n": 2}]
        # before: one add_reader and one remove_reader a reply (a new uvloop poll handle each)
        assert counts == {"add_reader": 1, "remove_reader": 0}
    finally:
        channel.close()
        theirs.close()


def test_a_socket_readable_with_nothing_awaited_leaves_the_loop_and_keeps_its_data() -> None:
    channel, theirs = _pair()

    async def scenario() -> tuple[dict[str, int], Received]:
        loop = asyncio.get_running_loop()
        counts = _counting(loop)
        done: asyncio.Future[Received] = loop.create_future()
        channel.read_soon(loop, done.set_result)
        theirs.sendall(_frame({"n": 1}))
        await done
        theirs.sendall(_frame({"n": 2}))  # nothing awaits it: a thread may read it
        for _ in range(5):
            await asyncio.sleep(0.005)
        after = dict(counts)
        again: asyncio.Future[Received] = loop.create_future()
        channel.read_soon(loop, again.set_result)  # the next batch registers it again
        return after, await again

    try:
        after, second = asyncio.run(scenario())
        assert after == {"add_reader": 1, "remove_reader": 1}  # left once, no spinning
        assert second == {"n": 2}
    finally:
        channel.close()
        theirs.close()


def test_closed_from_another_thread_it_leaves_the_loop_before_its_fd_is_reused() -> None:
    import threading

    import uvloop

    channel, theirs = _pair()

    async def scenario() -> Received:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Received] = loop.create_future()
        channel.read_soon(loop, done.set_result)
        theirs.sendall(_frame({"n": 1}))
        await done  # the socket stays registered with the loop
        closer = threading.Thread(target=channel.close)
        closer.start()
        await asyncio.to_thread(closer.join)
        await asyncio.sleep(0)  # the loop runs the close it was handed
        assert channel._sock.fileno() == -1
        # a new socket may get the same descriptor: the loop must hold no stale handle
        reused, peer = socket.socketpair()
        try:
            fresh = Channel(reused)
            got: asyncio.Future[Received] = loop.create_future()
            fresh.read_soon(loop, got.set_result)
            peer.sendall(_frame({"fresh": True}))
            return await asyncio.wait_for(got, 5)
        finally:
            fresh.close()
            peer.close()

    try:
        assert uvloop.run(scenario()) == {"fresh": True}
    finally:
        theirs.close()


class _CountingSocket(socket.socket):
    """A socket that counts its ``recv`` calls (each one system call)."""

    reads = 0

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self.reads += 1
        return super().recv(bufsize, flags)


def test_a_read_ahead_channel_reads_a_message_in_one_recv_and_keeps_the_next() -> None:
    ours, theirs = socket.socketpair()
    counting = _CountingSocket(fileno=ours.detach())
    channel = Channel(counting, read_ahead=True)
    big = {"pad": "y" * (3 * READ_AHEAD_BYTES)}  # past one read: in several
    try:
        theirs.sendall(_frame({"n": 1}) + _frame({"n": 2}))
        assert channel.recv(1.0) == {"n": 1}
        assert counting.reads == 1  # header and body together (before: one recv each)
        assert channel.recv(1.0) == {"n": 2}  # kept from the same read
        assert counting.reads == 1
        theirs.sendall(_frame(big) + _frame({"n": 3}))
        assert channel.recv(1.0) == big
        assert channel.recv(1.0) == {"n": 3}
        with pytest.raises(TimeoutError):
            channel.recv(0.01)
        theirs.close()
        with pytest.raises(ChannelClosed):
            channel.recv(1.0)
    finally:
        channel.close()
