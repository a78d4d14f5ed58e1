"""A real S3 endpoint for tests (moto's server on 127.0.0.1) and a fault-injecting proxy."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
from moto.server import ThreadedMotoServer

from fnrt.loader.retry import RetryPolicy
from fnrt.loader.stores.s3 import S3Config, S3Store

FAST_RETRY = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.02)
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class MotoEndpoint:
    url: str
    server: ThreadedMotoServer

    def make_bucket(self, name: str) -> None:
        boto3.client("s3", endpoint_url=self.url, region_name="us-east-1").create_bucket(
            Bucket=name
        )

    def store(
        self, bucket: str, prefix: str = "", url: str | None = None, **config: object
    ) -> S3Store:
        settings = {"retry": FAST_RETRY, "part_size_bytes": 5 * 1024 * 1024, **config}
        return S3Store(bucket, prefix, S3Config(endpoint_url=url or self.url, **settings))  # type: ignore[arg-type]


@contextlib.contextmanager
def moto_endpoint() -> Iterator[MotoEndpoint]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    # moto keeps its state per process, not per server: start every test empty
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST")).close()
    try:
        yield MotoEndpoint(url, server)
    finally:
        server.stop()


@dataclass
class MotoProcess:
    """moto's server in a process of its own, so that it can be frozen (``SIGSTOP``):
    the kernel still accepts its connections, and nothing answers them."""

    url: str
    process: subprocess.Popen[bytes]

    def make_bucket(self, name: str) -> None:
        boto3.client("s3", endpoint_url=self.url, region_name="us-east-1").create_bucket(
            Bucket=name
        )

    def store(self, bucket: str, prefix: str = "", **config: object) -> S3Store:
        settings = {"retry": FAST_RETRY, "part_size_bytes": 5 * 1024 * 1024, **config}
        return S3Store(bucket, prefix, S3Config(endpoint_url=self.url, **settings))  # type: ignore[arg-type]

    def freeze(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def moto_process(start_timeout_s: float = 60.0) -> Iterator[MotoProcess]:
    """moto's server as a subprocess on a free port, waited for by its "Running on" line."""
    port = free_port()
    server = Path(sys.executable).with_name("moto_server")
    process = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **CREDENTIALS},
    )
    try:
        assert process.stderr is not None
        said = b""
        with selectors.DefaultSelector() as selector:
            selector.register(process.stderr, selectors.EVENT_READ)
            end = time.monotonic() + start_timeout_s
            while b"Running on" not in said:
                left = end - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise RuntimeError(f"moto_server did not start: {said!r}")
                chunk = os.read(process.stderr.fileno(), 4096)
                if not chunk:
                    raise RuntimeError(f"moto_server exited: {said!r}")
                said += chunk
        # stderr is not read after this: moto logs a line a request, so drop them
        threading.Thread(target=_drain, args=(process.stderr,), daemon=True).start()
        yield MotoProcess(f"http://127.0.0.1:{port}", process)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _drain(stream: object) -> None:
    with contextlib.suppress(OSError, ValueError):
        while os.read(stream.fileno(), 65536):  # type: ignore[attr-defined]
            pass


@contextlib.contextmanager
def unanswered_listener() -> Iterator[str]:
    """The URL of a port whose connections never open: it listens with its backlog full
    and never accepts, so a connect waits (the SYN is dropped) until the client's
    connect timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    try:
        while True:  # fill the backlog until a connect is left waiting
            client = socket.socket()
            client.settimeout(0.5)
            try:
                client.connect(("127.0.0.1", port))
            except TimeoutError:
                client.close()
                break
            held.append(client)
        yield f"http://127.0.0.1:{port}"
    finally:
        for sock in held:
            sock.close()
        listener.close()


class FaultProxy:
    """A TCP proxy to ``target`` that can refuse connections or cut responses short.

    ``mode``: "pass"; "refuse" (accept, then close at once); "cut" (forward the
    request, then close after ``cut_after_bytes`` of the response), for the next
    ``faults`` connections (None: all of them).
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.mode = "pass"
        self.cut_after_bytes = 0
        self.faults: int | None = None
        self.connections = 0
        self.requests: list[bytes] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def set(self, mode: str, *, cut_after_bytes: int = 0, faults: int | None = None) -> None:
        with self._lock:
            self.mode, self.cut_after_bytes, self.faults = mode, cut_after_bytes, faults

    def _next_mode(self) -> tuple[str, int]:
        with self._lock:
            self.connections += 1
            mode = self.mode
            if mode != "pass" and self.faults is not None:
                if self.faults <= 0:
                    mode = "pass"
                else:
                    self.faults -= 1
            return mode, self.cut_after_bytes

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            mode, cut = self._next_mode()
            if mode == "refuse":
                client.close()
                continue
            threading.Thread(target=self._serve, args=(client, mode, cut), daemon=True).start()

    def _serve(self, client: socket.socket, mode: str, cut: int) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
        except OSError:
            client.close()
            return

        def upload() -> None:
            with contextlib.suppress(OSError):
                while data := client.recv(65536):
                    if data[:4] in (b"GET ", b"PUT ", b"HEAD", b"POST"):
                        with self._lock:
                            self.requests.append(data.split(b"\r\n", 1)[0])
                    upstream.sendall(data)
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_WR)

        threading.Thread(target=upload, daemon=True).start()
        sent = 0
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                if mode == "cut" and sent + len(data) >= cut:
                    client.sendall(data[: max(cut - sent, 0)])
                    break
                client.sendall(data)
                sent += len(data)
        for sock in (client, upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def gets(self, fragment: bytes) -> int:
        """How many GET requests named ``fragment`` in their path."""
        with self._lock:
            return sum(1 for r in self.requests if r.startswith(b"GET ") and fragment in r)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
