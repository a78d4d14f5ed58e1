"""A fleet on this machine: moto's S3 server, several ``fnrt serve`` nodes on it, and
nginx (Debian's package) running ``infra/nginx/fnrt.conf`` rendered for local ports."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from s3support import CREDENTIALS

from support import ServeProcess, free_port, launch_serve, stop_serve, wait_serving

ROOT = Path(__file__).resolve().parents[1]
NGINX_CONF = ROOT / "infra" / "nginx" / "fnrt.conf"
HASH_LINE = "    hash $fnrt_function consistent;"


def nginx_binary() -> str:
    """nginx's path, or skip the test saying how to get it."""
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )
    if found is None:
        pytest.skip("nginx is not installed (apt-get install nginx; .ci/run installs it)")
    return found


def render_nginx(work: Path, port: int, nodes: list[str], routing: str) -> Path:
    """``infra/nginx/fnrt.conf`` for ``nodes`` (host:port), listening on ``port``; its
    main configuration, with every path nginx writes inside ``work``."""
    conf = NGINX_CONF.read_text()
    assert HASH_LINE in conf and "    listen 8080;" in conf
    if routing == "round_robin":
        conf = conf.replace(HASH_LINE, "    # round robin")
    conf = conf.replace("    listen 8080;", f"    listen 127.0.0.1:{port};")
    (work / "fnrt.conf").write_text(conf)
    (work / "fnrt-nodes.conf").write_text(
        "".join(f"server {node} max_fails=3 fail_timeout=1s;\n" for node in nodes)
    )
    main = work / "nginx.conf"
    main.write_text(
        textwrap.dedent(f"""\
        user root;
        worker_processes 1;
        daemon off;
        pid {work}/nginx.pid;
        error_log {work}/error.log warn;
        events {{ worker_connections 4096; }}
        http {{
            access_log off;
            client_body_temp_path {work}/body;
            proxy_temp_path {work}/proxy;
            fastcgi_temp_path {work}/fastcgi;
            uwsgi_temp_path {work}/uwsgi;
            scgi_temp_path {work}/scgi;
            include {work}/fnrt.conf;
        }}
        """)
    )
    return main


@dataclass
class Fleet:
    """The S3 store's URL, the nodes, and nginx in front of them."""

    s3_url: str
    nodes: list[ServeProcess]
    url: str  # nginx

    def loads(self, name: str) -> list[int]:
        """How many times each node has loaded ``name`` (asked of each node directly)."""
        counts = []
        for node in self.nodes:
            if node.proc.poll() is not None:
                counts.append(-1)
                continue
            r = httpx.get(f"{node.url}/v1/functions/{name}", timeout=10)
            counts.append(int(r.json()["instance"]["loads"]) if r.status_code == 200 else 0)
        return counts


def _wait_answering(
    url: str, proc: subprocess.Popen[bytes], timeout_s: float, why: Callable[[], str]
) -> None:
    """Until ``url`` answers at all; AssertionError(``why()``) if ``proc`` exits first
    or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError(why()) from None
            time.sleep(0.05)


def _moto() -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=os.environ | CREDENTIALS,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    _wait_answering(f"{url}/moto-api/", proc, 30, lambda: "moto's server did not start")
    import boto3

    boto3.client(
        "s3", endpoint_url=url, region_name="us-east-1", **_boto_credentials()
    ).create_bucket(Bucket="fnrt")
    return url, proc


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    }


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def fleet(tmp: Path, nodes: int = 3, routing: str = "hash", *flags: str) -> Iterator[Fleet]:
    """``nodes`` fnrt nodes on one moto S3 store behind nginx, until the block ends."""
    binary = nginx_binary()
    with contextlib.ExitStack() as exits:
        s3_url, moto = _moto()
        exits.callback(_stop, moto)
        node_flags = (
            "--store", "s3://fnrt/fleet", "--s3-endpoint", s3_url,
            "--watch-interval-s", "0.5", "--log-level", "warning", "--no-request-log",
            "--isolation", "thread",  # routing is under test here; workers only cost time
            *flags,
        )  # fmt: skip
        servers = []
        for i in range(nodes):  # all start at once; then each is waited for
            node_dir = tmp / f"node{i}"
            node_dir.mkdir()
            servers.append(launch_serve(node_dir, *node_flags, env=CREDENTIALS))
            exits.callback(stop_serve, servers[-1])
        for server in servers:
            wait_serving(server)
        work = tmp / "nginx"
        work.mkdir()
        port = free_port()
        conf = render_nginx(work, port, [s.url.removeprefix("http://") for s in servers], routing)
        nginx = subprocess.Popen([binary, "-c", str(conf), "-p", str(work)])
        exits.callback(_stop, nginx)  # type: ignore[arg-type]
        url = f"http://127.0.0.1:{port}"
        error_log = work / "error.log"
        _wait_answering(
            f"{url}/healthz",
            nginx,
            10,
            lambda: f"nginx did not start: {error_log.read_text() if error_log.exists() else ''}",
        )
        yield Fleet(s3_url, servers, url)


def redis_binary() -> str:
    """redis-server's path, or skip the test saying how to get it."""
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None
    )
    if found is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run does)")
    return found


class RedisServer:
    """Debian's redis-server on a free port of 127.0.0.1, nothing saved to disk;
    ``stop`` and ``start`` again on the same port (a restart)."""

    def __init__(self, work: Path) -> None:
        self.binary = redis_binary()
        self.work = work
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(self.work), "--loglevel", "warning"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1) as s,
            ):
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError("redis-server did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)  # type: ignore[arg-type]
            self.proc = None


@contextlib.contextmanager
def redis_server(work: Path) -> Iterator[RedisServer]:
    server = RedisServer(work)
    server.start()
    try:
        yield server
    finally:
        server.stop()
