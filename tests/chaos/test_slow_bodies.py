"""1,000 bodies trickled at a byte a second against a server limited to 1,024 open files."""

from __future__ import annotations

import json
import os
import resource
import select
import socket
import threading
import time
from pathlib import Path

import httpx

from fnrt.runtime.cli.main import main
from support import serve_process, write_function

SLOW = 1000
WINDOW_S = 4.0  # --body-rate-window-s for the test (the default is longer)
SLOW_HEAD = (
    b"POST /v1/functions/echo/invoke HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
    b"content-length: 4096\r\n\r\n{"  # a body that arrives at a byte a second
)


class Trickle:
    """Sockets sending their body a byte a second, each until the server answers it."""

    def __init__(self) -> None:
        self.open: dict[int, socket.socket] = {}
        self.answers: list[bytes] = []
        self.resets = 0
        self._stop = threading.Event()
        self.ticked = threading.Event()  # every socket has sent a byte after its head
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self.open[sock.fileno()] = sock

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.tick()
            self.ticked.set()

    def tick(self) -> None:
        with self._lock:
            socks = list(self.open.values())
        for sock in socks:
            # asked of each socket right before its byte, not once for all: an answer
            # that lands while a tick walks 1,000 sockets is read, not sent a byte
            # after the server closed (the kernel would reset it and drop the answer)
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            try:
                if poller.poll(0):  # read the answer before sending more (a send would reset)
                    self._finish(sock, self._read_answer(sock))
                else:
                    sock.sendall(b" ")
            except OSError:
                self._finish(sock, None)

    @staticmethod
    def _read_answer(sock: socket.socket) -> bytes | None:
        """What the server sent until it closed; None: a reset came before any of it.
        An answer the kernel holds before a reset is read first: the client has it."""
        sock.settimeout(5)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except OSError:
            if not out:
                raise
        return out

    def _finish(self, sock: socket.socket, answer: bytes | None) -> None:
        with self._lock:
            self.open.pop(sock.fileno(), None)
            if answer is None:
                self.resets += 1
            else:
                self.answers.append(answer)
        sock.close()

    def wait_all_answered(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.open and time.monotonic() < deadline:
            time.sleep(0.2)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in list(self.open.values()):
            sock.close()


def test_slow_bodies_leave_room_for_normal_requests(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4 * SLOW:  # this process holds the slow sockets
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4 * SLOW, hard), hard))
    env = {"FNRT_BODY_RATE_WINDOW_S": str(WINDOW_S)}
    with serve_process(tmp_path, "--log-level", "warning", env=env, nofile=1024) as server:
        folder = write_function(tmp_path / "src", "echo")
        assert main(["deploy", str(folder), "--server", server.url, "-q"]) == 0
        port = int(server.url.rsplit(":", 1)[1])
        trickle = Trickle()
        clients = [httpx.Client(base_url=server.url, timeout=30) for _ in range(10)]
        statuses: list[int | str] = []
        try:
            started = time.monotonic()
            for _ in range(SLOW):  # more than the server holds open: 1,024 less its reserve
                sock = socket.create_connection(("127.0.0.1", port))
                sock.sendall(SLOW_HEAD)
                trickle.add(sock)
            trickle.start()
            assert trickle.ticked.wait(30)  # the bodies are trickling: now the normal clients
            for i in range(5):  # 10 keep-alive clients, 5 requests each, taking turns:
                for c in clients:  # each waits between its requests while the others ask
                    try:
                        r = c.post("/v1/functions/echo/invoke", json={"x": [[i, 1, 2, 3]]})
                        statuses.append(r.status_code)
                    except httpx.TransportError as exc:  # a keep-alive closed under it
                        statuses.append(type(exc).__name__)
            asked_s = time.monotonic() - started
            open_files = len(os.listdir(f"/proc/{server.proc.pid}/fd"))
            trickle.wait_all_answered(3 * WINDOW_S)
        finally:
            trickle.close()
            for c in clients:
                c.close()
        assert statuses.count(200) >= 49, statuses  # was 45 of 50 503 and 3 ReadError
        assert open_files < 1024 - 128  # the reserve stayed free
        assert "Too many open files" not in "".join(server.log)
        # every slow body held is answered 408, saying why, within its window or to make
        # room; one that came while every connection held had not yet waited long enough
        # to be judged was refused 503 (busy) at once
        assert not trickle.open, f"{len(trickle.open)} slow bodies still open"
        # an answer followed by a reset (a byte sent after the server closed) is read
        # whole first: the client has it. A reset before any answer is a body lost
        assert trickle.resets < SLOW // 20, (trickle.resets, asked_s)
        too_slow = 0
        for answer in trickle.answers:
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith((b"HTTP/1.1 408", b"HTTP/1.1 503")), answer
            if head.startswith(b"HTTP/1.1 408"):
                assert "bytes/s" in json.loads(body)["error"]
                too_slow += 1
        assert too_slow >= SLOW // 2, (too_slow, len(trickle.answers))
