"""Instances in worker processes: the server's side of process isolation.

A :class:`ProcessInstance` looks to the instance pool like any other instance
(``run_timed`` on its executor's thread, ``close``), but its handler runs in
a worker process (``worker.py``). Batches go to the worker and results come
back through shared-memory arenas (``arena.py``); a worker that dies, runs
past the batch timeout, or grows past its memory limit fails only that batch
with an :class:`~fnrt.functions.errors.InstanceLost` naming the cause, and the
instance reports itself dead so the pool replaces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from fnrt.functions.errors import (
    HandlerTimeout,
    InstanceLost,
)
from fnrt.functions.generation import StepBatch, Stepped
from fnrt.functions.handler import Device, Request
from fnrt.functions.version import VersionManifest
from fnrt.loader.arena import Arena
from fnrt.loader.channel import Channel, ChannelClosed, Received
from fnrt.loader.instance import LoadTier, Ran
from fnrt.loader.staging import Staged
from fnrt.tracing.handler_spans import TraceParent

log = logging.getLogger("fnrt.loader")

#: How often a worker's resident memory is checked against its limit.
MEMORY_POLL_S = 0.05
#: How long a closing worker gets for its handler's ``unload`` before it is killed.
CLOSE_TIMEOUT_S = 10.0
#: How long a worker gets to import its handler and run ``load`` (``timeout_s`` bounds
#: batches, which are much shorter than a model's load).
LOAD_TIMEOUT_S = 600.0
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
R = TypeVar("R")


class RemoteError(Exception):
    """The handler raised in the worker; ``str()`` is its ``Type: message``."""

    def __init__(self, reason: str, remote_traceback: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.remote_traceback = remote_traceback


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def _exited(pid: int) -> bool:
    """Whether the child ``pid`` has ended, without waiting for it (it stays for
    ``Popen`` to reap). ``Popen.poll`` cannot say: it answers None, "running",
    while another thread holds its lock (the memory watcher polls every
    ``MEMORY_POLL_S``), so a worker killed while idle would look alive."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already, by the thread that held the lock
        return True


def exit_cause(returncode: int | None) -> tuple[str, str]:
    """(cause word, sentence) for a worker that ended with ``returncode``."""
    if returncode is None:
        return "exit", "the worker stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return "signal", f"the worker was killed by {name}"
    return "exit", f"the worker exited with code {returncode}"


def _checked(reply: dict[str, Any]) -> dict[str, Any]:
    """The worker's ``reply``; RemoteError when it says the handler raised."""
    if not reply["ok"]:
        raise RemoteError(reply["error"], reply.get("traceback", ""))
    return reply


def _ran(responses: Arena, reply: dict[str, Any]) -> Ran:
    """A batch's results (copied out of the response arena, which the worker reuses)
    and timings, from the worker's reply."""
    results = responses.read(reply, copy=True)
    spans = reply.get("spans") or []
    return Ran(results, float(reply["infer_s"]), float(reply["output_s"]), spans)


#: The parent a batch sent ahead gives its handler's spans in the worker (its batch's
#: span is made only when it runs): :func:`reparented` gives them the real one.
AHEAD_TRACE: TraceParent = ("0" * 31 + "1", "0" * 15 + "1")


def reparented(spans: list[dict[str, Any]], trace: TraceParent | None) -> list[dict[str, Any]]:
    """Handler spans recorded under :data:`AHEAD_TRACE`, moved under ``trace`` (the
    batch's span, made when it ran); none when the batch was not traced."""
    if trace is None or not spans:
        return []
    trace_id, span_id = trace
    placeholder = AHEAD_TRACE[1]
    for span in spans:
        span["trace_id"] = trace_id
        if span["parent_span_id"] == placeholder:
            span["parent_span_id"] = span_id
    return spans


class SentAhead:
    """A worker's second pair of arenas, as the batcher sees it: a batch "staged" ahead
    is written into the request arena the running batch does not use and sent at once,
    so the worker starts on it as soon as it has answered the running one (and, a
    ``forward`` handler, stages it on its host lane meanwhile)."""

    def __init__(self, instance: ProcessInstance) -> None:
        self.instance: ProcessInstance | None = instance  # None once it has ended

    def release(self, staged: Staged) -> None:
        """A batch sent ahead that will not be answered: its reply is read and dropped
        (the channel stays in order), whatever it is."""
        sent = staged.sent
        if sent is not None:
            sent.add_done_callback(_dropped)


def _nothing() -> None:
    pass


class _Reply(asyncio.Future[R]):
    """The reply to a batch that the loop's reader callback reads: cancelled, its
    instance is given up at once (``on_cancel``), not in a done callback a turn later;
    the unread reply would answer the next batch."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_cancel: Callable[[asyncio.Future[Any]], None]
    ) -> None:
        super().__init__(loop=loop)
        self._on_cancel = on_cancel

    def cancel(self, msg: Any = None) -> bool:
        if not super().cancel(msg):
            return False
        self._on_cancel(self)
        return True


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _dropped(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: no "never retrieved" warning


def _step_message(
    batch: StepBatch, trace: TraceParent | None
) -> tuple[dict[str, Any], list[Request]]:
    """A step's message (the joining sequences' parameters, the leaving ids) and the
    joining sequences' inputs, which go through the request arena."""
    message = {
        "op": "step",
        "trace": trace,
        "joining": [[j.id, dict(j.parameters), j.max_new_tokens] for j in batch.joining],
        "leaving": list(batch.leaving),
    }
    return message, [j.inputs for j in batch.joining]


def _stepped(responses: Arena, reply: dict[str, Any]) -> Stepped:
    """A step's chunks (copied out of the response arena) from the worker's reply."""
    return Stepped(
        list(reply["ids"]),
        responses.read(reply, copy=True),
        list(reply["ended"]),
        float(reply["infer_s"]),
        float(reply["output_s"]),
        reply.get("spans") or [],
    )


class ProcessInstance:
    """One loaded handler in a worker process."""

    apart = True  # Runnable.apart: a batch computes in the worker

    def __init__(
        self,
        vm: VersionManifest,
        executor: Executor,
        process: subprocess.Popen[bytes],
        channel: Channel,
        workdir: Path,
        release: Any,
    ) -> None:
        self.version = vm
        self.executor = executor
        self.timings_s: dict[str, float] = {}
        self.size_bytes = 0  # its handler's tensors, its pinned ring and interpreter_bytes
        self.interpreter_bytes = 0  # the worker's own heap before the handler's, measured
        self.device_bytes = 0  # its handler's tensors and its context_bytes
        self.context_bytes = 0  # the worker's CUDA context and workspaces, measured
        self.device = Device()  # where it runs: the GPU placement chose, or the CPU
        self.stages = False
        self.tier = LoadTier.L2
        self._process = process
        self._channel = channel
        self._workdir = workdir
        self._release = release
        # Two arenas each way: batch k+1 is written into one while the worker computes
        # batch k from the other (the n-th batch sent uses pair n % 2).
        self._requests = [Arena(workdir / f"requests{i}", create=True) for i in (0, 1)]
        self._responses = [Arena(workdir / f"responses{i}", create=True) for i in (0, 1)]
        self._sent = 0  # messages with a batch sent so far
        self._last: asyncio.Future[Any] | None = None  # the exchange sent last
        # the exchange whose reply the loop's reader callback reads, and how to stop it
        self._reading: tuple[asyncio.Future[Any] | None, Callable[[], None]] = (None, _nothing)
        # a batch sent while the worker loads (send_early): its reply, read once the
        # load's is; whether the load's reply has been read (or the load failed)
        self._early_lock = threading.Lock()
        self._early: tuple[asyncio.Future[Ran], int] | None = None
        self._loaded = False
        self._load_failed: BaseException | None = None
        self.sent_during_load = 0  # batches sent right behind the load message
        self._losing: asyncio.Future[None] | None = None  # finding why a worker was lost
        self._using: list[asyncio.Future[Any] | None] = [None, None]  # per pair
        self.stager: SentAhead | None = SentAhead(self)
        self.sent_ahead = 0  # batches sent while another computed (for tests and benches)
        self._isolation = vm.manifest.isolation
        self._killed_for: tuple[str, str] | None = None  # set by the memory watch
        self._lost: InstanceLost | None = None
        self._closed = False
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None
        if self._isolation.memory_limit_bytes:
            self._watch = threading.Thread(
                target=self._watch_memory, name=f"fnrt-rss-{process.pid}", daemon=True
            )
            self._watch.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def workdir(self) -> Path:
        """The folder of its shared-memory arenas (removed when the instance ends)."""
        return self._workdir

    @property
    def alive(self) -> bool:
        if self._closed or self._lost is not None or self._process.returncode is not None:
            return False
        return not _exited(self._process.pid)

    # --- serving ------------------------------------------------------------------------

    def start(
        self, start: dict[str, Any], on_sent: Callable[[ProcessInstance], None] | None = None
    ) -> dict[str, Any]:
        """Send the load message; the worker's answer (blocking). ``on_sent`` is told
        once the message is sent: a batch may then follow it at once
        (:meth:`send_early`), for the worker to run as soon as its load returns."""
        start = {
            **start,
            "requests": [str(arena.path) for arena in self._requests],
            "responses": [str(arena.path) for arena in self._responses],
        }
        self._channel.send(start)
        if on_sent is not None:
            on_sent(self)
        try:
            reply = _checked(self._receive(max(LOAD_TIMEOUT_S, self._isolation.timeout_s)))
        except BaseException as exc:
            self._load_read(exc)
            raise
        self._load_read(None)
        return reply

    def send_early(self, batch: list[Request], traced: bool = True) -> Staged:
        """Send ``batch`` right behind the load message, while the worker loads (from the
        event loop): written into a request arena and sent now, so the worker runs it as
        soon as its load returns, with no round trip between. Its reply is read on the
        loop once the load's reply is in (the load's thread reads that one); a load that
        fails ends it with the load's error. After the load's reply, as
        :meth:`stage_soon` (``traced``: its)."""
        assert self.stager is not None
        started, sent_ns = time.perf_counter(), time.time_ns()
        with self._early_lock:
            loaded, failed = self._loaded, self._load_failed
            if failed is not None:  # its arenas may be gone: nothing is sent
                refused: asyncio.Future[Ran] = asyncio.get_running_loop().create_future()
                refused.set_exception(failed)  # the load's own error answers the batch
                return Staged(None, [0] * len(batch), {}, 0.0, self.stager, refused)
            if not loaded:
                replied: asyncio.Future[Ran] = _Reply(asyncio.get_running_loop(), self._given_up)
                pair = self._sent & 1
                self._sent += 1
                trace = AHEAD_TRACE if traced else None
                self._send(pair, {"op": "run", "trace": trace}, batch)  # False: the
                # worker is gone, which the load's thread finds and ends ``replied`` with
                self._early = (replied, pair)
                self._last = self._using[pair] = replied
        if loaded:
            return self.stage_soon(batch, traced).result()
        self.sent_during_load += 1
        elapsed = time.perf_counter() - started
        return Staged(None, [0] * len(batch), {}, elapsed, self.stager, replied, sent_ns)

    def _load_read(self, error: BaseException | None) -> None:
        """The load's reply is read (``error``: or the load failed), on the load's thread:
        the reply to a batch sent during the load is read on the loop from now."""
        with self._early_lock:
            self._loaded, self._load_failed = True, error
            early, self._early = self._early, None
        if early is None:
            return
        replied, pair = early
        with contextlib.suppress(RuntimeError):  # the loop has ended: nobody waits for it
            if error is None:
                replied.get_loop().call_soon_threadsafe(self._read_reply, replied, pair, _ran)
            else:
                replied.get_loop().call_soon_threadsafe(_fail, replied, error)

    def run_timed(self, batch: list[Request], trace: TraceParent | None = None) -> Ran:
        """One batch, blocking (the instance's thread; nothing in flight from the loop)."""
        pair, reply = self._exchange({"op": "run", "trace": trace}, batch)
        return _ran(self._responses[pair], reply)

    def run_soon(
        self, batch: list[Request], trace: TraceParent | None = None
    ) -> asyncio.Future[Ran]:
        """:meth:`run_timed` from the event loop. The batch is written and its message
        sent now, so the worker starts on it while the loop answers the requests of the
        last one; the reply is awaited on the loop. No thread hop (nor handing the GIL
        to a thread and back). A batch cancelled while it runs leaves the worker's
        reply unread: the instance is then given up."""
        return self._soon({"op": "run", "trace": trace}, batch, _ran)

    def stage_soon(self, batch: list[Request], traced: bool = True) -> asyncio.Future[Staged]:
        """Send ``batch`` ahead while the worker computes the one before: written into the
        other request arena and its message sent now (the worker reads it as soon as it
        has answered, with no round trip between). ``traced`` (the node traces): its
        handler's spans are recorded under :data:`AHEAD_TRACE`, moved under its batch's
        span when it runs; else none are (the worker then sets up no span context,
        nor, the first time, OpenTelemetry's: about 5 ms of a worker's first such
        batch)."""
        assert self.stager is not None
        start = time.perf_counter()
        sent = self._soon({"op": "run", "trace": AHEAD_TRACE if traced else None}, batch, _ran)
        self.sent_ahead += 1
        rows = [0] * len(batch)  # the batcher counts its rows itself
        staged = Staged(None, rows, {}, time.perf_counter() - start, self.stager, sent)
        done: asyncio.Future[Staged] = asyncio.get_running_loop().create_future()
        done.set_result(staged)
        return done

    def run_staged_soon(
        self, staged: Staged, trace: TraceParent | None = None
    ) -> asyncio.Future[Ran]:
        """The reply to a batch sent ahead (:meth:`stage_soon`), its handler's spans under
        ``trace``."""
        sent: asyncio.Future[Ran] = staged.sent

        async def ran() -> Ran:
            done = await sent
            return replace(done, spans=reparented(list(done.spans), trace))

        return asyncio.ensure_future(ran())

    def run_staged(self, staged: Staged, trace: TraceParent | None = None) -> Ran:
        raise RuntimeError("a batch sent ahead to a worker is awaited on the loop")

    def step_timed(self, batch: StepBatch, trace: TraceParent | None = None) -> Stepped:
        """One step of a generative handler in the worker: the joining sequences' inputs
        through the request arena, their parameters and the leaving ids in the message."""
        pair, reply = self._exchange(*_step_message(batch, trace))
        return _stepped(self._responses[pair], reply)

    def step_soon(
        self, batch: StepBatch, trace: TraceParent | None = None
    ) -> asyncio.Future[Stepped]:
        """:meth:`step_timed` from the event loop, as :meth:`run_soon` runs a batch."""
        return self._soon(*_step_message(batch, trace), _stepped)

    def _soon(
        self,
        message: dict[str, Any],
        arrays: list[Request],
        answer: Callable[[Arena, dict[str, Any]], R],
    ) -> asyncio.Future[R]:
        """Send ``message`` with ``arrays`` now; the future of its reply on the loop,
        which ``answer`` reads (from the response arena): read by the loop's reader
        callback when nothing else is in flight (:meth:`_reply_soon`), else by a task.

        Two exchanges may be in flight, one a pair of arenas: the n-th is sent at once
        unless the (n-2)-th, which used its pair, is still unanswered (a third batch
        waits for it), and reads its reply after the (n-1)-th has read its own (the
        worker answers in order). Its ``timeout_s`` counts from when the one before
        it was answered: the worker computes them one after the other."""
        pair = self._sent & 1
        self._sent += 1
        before, using = self._last, self._using[pair]
        if before is None or before.done():
            # nothing in flight (a lone batch, and most below a full load): its reply is
            # read by the loop's reader callback, no task between the worker and the batch
            replied = self._reply_soon(pair, message, arrays, answer)
            self._last = self._using[pair] = replied
            return replied
        sent: bool | None = None
        if using is None or using.done():
            sent = self._lost is None and self._send(pair, message, arrays)
        timeout_s = self._isolation.timeout_s or math.inf

        async def answered() -> R:
            nonlocal sent
            if sent is None:  # a third batch: its pair frees when the first is answered
                assert using is not None
                await asyncio.wait((using,))
                sent = self._lost is None and self._send(pair, message, arrays)
            if before is not None and not before.done():
                await asyncio.wait((before,))
            reply = await self._reply_on_loop(sent, time.monotonic() + timeout_s)
            return answer(self._responses[pair], reply)

        task = self._watched(asyncio.ensure_future(answered()))
        self._last = self._using[pair] = task
        return task

    def _reply_soon(
        self,
        pair: int,
        message: dict[str, Any],
        arrays: list[Request],
        answer: Callable[[Arena, dict[str, Any]], R],
    ) -> asyncio.Future[R]:
        """Send ``message`` with ``arrays`` on ``pair`` (nothing else in flight); the future
        of its reply, which ``answer`` reads in the loop's reader callback as it comes
        (:meth:`Channel.read_soon`). A lost worker, a closed channel or ``timeout_s``
        passing first end it with the worker's InstanceLost, as :meth:`_reply_on_loop`."""
        loop = asyncio.get_running_loop()
        replied: asyncio.Future[R] = _Reply(loop, self._given_up)
        if self._lost is not None:
            replied.set_exception(self._lost)
            return replied
        if not self._send(pair, message, arrays):
            self._lose_soon(replied, self._died)
            return replied
        self._read_reply(replied, pair, answer)
        return replied

    def _read_reply(
        self, replied: asyncio.Future[R], pair: int, answer: Callable[[Arena, dict[str, Any]], R]
    ) -> None:
        """Read the reply to the exchange sent on ``pair`` in the loop's reader callback,
        into ``replied`` (``answer`` reads the response arena)."""
        if replied.done():  # cancelled before its reply could be read: given up already
            return
        loop = replied.get_loop()
        responses = self._responses[pair]
        timer: asyncio.TimerHandle | None = None

        def deliver(reply: Received) -> None:
            if timer is not None:
                timer.cancel()
            if replied.done():  # cancelled meanwhile (it stopped reading, too)
                return
            if isinstance(reply, ChannelClosed):
                self._lose_soon(replied, self._died)
                return
            try:
                replied.set_result(answer(responses, _checked(reply)))
            except Exception as exc:  # RemoteError: the handler raised
                replied.set_exception(exc)

        stop = self._channel.read_soon(loop, deliver)
        self._reading = (replied, stop)
        timeout_s = self._isolation.timeout_s
        if timeout_s:

            def timed_out() -> None:
                stop()
                if not replied.done():
                    self._lose_soon(replied, lambda: self._timed_out(timeout_s))

            timer = loop.call_later(timeout_s, timed_out)

    def _lose_soon(self, replied: asyncio.Future[Any], find: Callable[[], InstanceLost]) -> None:
        """End ``replied`` with the InstanceLost that ``find`` says (it waits for the worker
        or kills it: on a thread)."""

        async def lose() -> None:
            lost = await asyncio.to_thread(find)
            if not replied.done():
                replied.set_exception(lost)

        self._losing = asyncio.ensure_future(lose())

    def _exchange(
        self, message: dict[str, Any], arrays: list[Request]
    ) -> tuple[int, dict[str, Any]]:
        """Send one message with ``arrays`` in a request arena; the pair of arenas it used
        and the worker's reply (RemoteError if the handler raised there)."""
        if self._lost is not None:
            raise self._lost
        pair = self._sent & 1
        self._sent += 1
        if not self._send(pair, message, arrays):
            raise self._died()
        return pair, _checked(self._receive(self._isolation.timeout_s or None))

    def _send(self, pair: int, message: dict[str, Any], arrays: list[Request]) -> bool:
        """Write ``arrays`` into the request arena ``pair`` and send ``message`` with their
        layout (the worker answers into the response arena of the same pair); False
        when the worker is gone."""
        layout = self._requests[pair].write(arrays)
        try:
            self._channel.send({**message, **layout, "pair": pair})
        except ChannelClosed:
            return False
        return True

    async def _reply_on_loop(self, sent: bool, deadline: float) -> dict[str, Any]:
        """The reply to what :meth:`_send` sent (``sent``: whether it could), awaited on
        the running event loop until ``deadline`` (``time.monotonic``)."""
        if self._lost is not None:
            raise self._lost
        timeout_s = self._isolation.timeout_s
        try:
            if not sent:
                raise ChannelClosed("the worker is gone")
            left = deadline - time.monotonic()
            reply = await self._channel.receive(left if left < math.inf else None)
        except TimeoutError:
            lost = await asyncio.to_thread(self._timed_out, timeout_s)
            raise lost from None
        except ChannelClosed:
            lost = await asyncio.to_thread(self._died)
            raise lost from None
        return _checked(reply)

    def _watched(self, exchange: asyncio.Future[R]) -> asyncio.Future[R]:
        """``exchange``, whose message is sent: cancelled (even before it ran), it
        leaves the worker's reply unread, which would answer the next exchange, so the
        instance is given up (and the loop stops reading its channel)."""

        exchange.add_done_callback(self._given_up)
        return exchange

    def _given_up(self, exchange: asyncio.Future[Any]) -> None:
        if exchange.cancelled():
            if self._reading[0] is exchange:
                self._reading[1]()
            if self._lost is None:
                reason = "a batch was cancelled while it ran"
                self._lost = InstanceLost(self.version.name, "", reason, cause="stopped")

    def _receive(self, timeout_s: float | None) -> dict[str, Any]:
        try:
            return self._channel.recv(timeout_s)
        except TimeoutError:
            assert timeout_s is not None
            raise self._timed_out(timeout_s) from None
        except ChannelClosed:
            raise self._died() from None

    def _timed_out(self, timeout_s: float) -> InstanceLost:
        """Kill a worker whose batch ran past ``timeout_s``; why, as the batch's error."""
        over = self._over_memory()  # past both limits: memory is the cause to report
        self._kill()
        if over is not None:
            self._lost = InstanceLost(self.version.name, "", over, cause="memory")
        else:
            self._lost = HandlerTimeout(self.version.name, "", timeout_s)
        return self._lost

    def ended(self) -> InstanceLost:
        """Why it is not alive: what a batch lost it to, or how its worker ended while
        idle (killed from outside, say)."""
        return self._lost or self._died()

    def _died(self) -> InstanceLost:
        try:
            code: int | None = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._kill()
            code = None
        cause, reason = self._killed_for or exit_cause(code)
        self._lost = InstanceLost(self.version.name, "", reason, cause=cause)
        return self._lost

    # --- limits -------------------------------------------------------------------------

    def _over_memory(self) -> str | None:
        """Why the worker must be killed for its memory, or None while under its limit."""
        limit = self._isolation.memory_limit_bytes
        used = rss_bytes(self.pid)
        if not limit or used <= limit:
            return None
        return (
            f"the worker was killed: its resident memory ({used >> 20} MiB) passed "
            f"isolation.memory_limit_bytes ({limit >> 20} MiB)"
        )

    def _watch_memory(self) -> None:
        while not self._stop.wait(MEMORY_POLL_S):
            over = self._over_memory()
            if over is not None:
                self._killed_for = ("memory", over)
                self._kill()
                return
            if self._process.poll() is not None:
                return

    def _kill(self) -> None:
        if self._process.poll() is None:
            # its whole group (it leads one): the processes its handler started go with
            # it now; its keeper finds any that left the group (descendants.py)
            with contextlib.suppress(OSError):
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.kill()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait
            log.error("worker %d did not die after SIGKILL", self.pid)

    # --- ending -------------------------------------------------------------------------

    def close(self) -> None:
        """Let the handler ``unload`` in the worker, then end the worker and its arenas."""
        if self._closed:
            return
        last = self._last
        if last is not None and not last.done():
            # a batch in flight, its reply read by the loop (a first batch sent during a
            # load that then failed to be served): no second reader on the socket
            self._end()
            return
        if self.alive:
            try:
                self._channel.send({"op": "close"})
                self._channel.recv(CLOSE_TIMEOUT_S)
                self._process.wait(timeout=CLOSE_TIMEOUT_S)
            except (ChannelClosed, TimeoutError, subprocess.TimeoutExpired):
                log.warning("worker %d of %s did not close in time", self.pid, self.version.name)
        self._end()

    def abandon(self) -> None:
        """End the worker now (it is stuck or already dead)."""
        if not self._closed:
            self._end()

    def _end(self) -> None:
        self._closed = True
        self._stop.set()
        self._kill()
        self._channel.close()
        for arena in (*self._requests, *self._responses):
            arena.close()
        shutil.rmtree(self._workdir, ignore_errors=True)
        self.executor.shutdown(wait=False)
        self._release()
        # Let go of its exchanges (their replies hold the last batches' results) and of
        # its SentAhead: nothing cycles through it now, so its reference count frees it
        # when the pool lets it go, with no collection (the server collects nothing at
        # a worker's unload, and a full collection may be thousands of requests away).
        self._last = self._losing = None
        self._using = [None, None]
        self._reading = (None, _nothing)
        if self.stager is not None:
            self.stager.instance = None
