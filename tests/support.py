"""Test helpers: function folders written inline, a live server on a free port, gates."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
import types
import weakref
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvicorn
from starlette.applications import Starlette

from fnrt.functions.bundle import pack
from fnrt.functions.manifest import load_manifest
from fnrt.functions.version import VersionManifest
from fnrt.loader.cache import BlobCache, CacheConfig
from fnrt.loader.device import detect_device
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.repository import Repository
from fnrt.loader.stores import FileStore
from fnrt.runtime.clock import Clock
from fnrt.runtime.deployment import Deployed
from fnrt.runtime.http.app import build_app, connection_limits, data_apps
from fnrt.runtime.http.connection import guarded_protocol
from fnrt.runtime.node import Node, build_node
from fnrt.runtime.prewarm.keeper import Keeper
from fnrt.runtime.registry import Registry
from fnrt.runtime.settings import ServerSettings
from fnrt.tracing.telemetry import Telemetry

T = TypeVar("T")

# Handlers written by tests reach the test through this module: `import fnrt_test_gates`.
gates = types.ModuleType("fnrt_test_gates")
gates.events = {}  # type: ignore[attr-defined]
gates.instances = []  # type: ignore[attr-defined]
gates.loads = []  # type: ignore[attr-defined]


def read_to_close(sock: socket.socket) -> bytes:
    """Everything a server sends on ``sock`` until it closes (the socket's timeout
    bounds the wait)."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def gate(name: str) -> threading.Event:
    """A threading.Event shared with handler code as ``fnrt_test_gates.events[name]``."""
    event: threading.Event = gates.events.setdefault(name, threading.Event())  # type: ignore[attr-defined]
    return event


gates.gate = gate  # type: ignore[attr-defined]
gates.track = lambda obj: gates.instances.append(weakref.ref(obj))  # type: ignore[attr-defined]
sys.modules["fnrt_test_gates"] = gates


def reset_gates() -> None:
    gates.events.clear()  # type: ignore[attr-defined]
    gates.instances.clear()  # type: ignore[attr-defined]
    gates.loads.clear()  # type: ignore[attr-defined]


ECHO_HANDLER = """
import numpy as np

class Echo:
    def load(self, artifacts, device):
        self.scale = 2.0

    def __call__(self, batch):
        return [{"y": r["x"] * self.scale} for r in batch]
"""

#: A handler that misbehaves as its first input's first value says: 1 segfaults, 2 exits,
#: 3 hangs, 4 allocates without bound, 5 raises, 6 answers its process id, -7 how many
#: objects its process froze out of the collector; else y = 2x.
MISBEHAVING_HANDLER = """
import ctypes, gc, os, time
import numpy as np

class H:
    def load(self, artifacts, device):
        self.pid = os.getpid()
        self.hoard = []

    def __call__(self, batch):
        what = int(batch[0]["x"][0, 0])
        if what == 1:
            ctypes.string_at(0)
        if what == 2:
            os._exit(1)
        if what == 3:  # hangs (a test's gates are all released when it ends)
            try:
                import fnrt_test_gates
                fnrt_test_gates.gate("hang").wait(3600)
            except ImportError:  # in a worker process: killed by its timeout
                time.sleep(3600)
        if what == 4:
            while True:
                self.hoard.append(np.ones(8 << 20, dtype=np.uint8))
        if what == 5:
            raise ValueError("bad input")
        if what == 6:
            return [{"y": np.full((1, 4), self.pid, dtype=np.float32)} for _ in batch]
        if what == -7:  # how many objects the collector no longer walks
            return [{"y": np.full((1, 4), gc.get_freeze_count(), np.float32)} for _ in batch]
        return [{"y": r["x"] * 2} for r in batch]
"""

#: A handler whose output depends on its weights file (w[0] is added to x).
WEIGHTED_HANDLER = """
import numpy as np
import fnrt_test_gates

class Weighted:
    def load(self, artifacts, device):
        self.w = np.fromfile(artifacts["w"].path, dtype=np.uint8)
        fnrt_test_gates.loads.append(len(self.w))

    def __call__(self, batch):
        return [{"y": r["x"] + float(self.w[0])} for r in batch]
"""

WEIGHTED_MANIFEST = """
name = "{name}"
handler = "handler:Weighted"

[artifacts]
w = "w.bin"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}
"""


#: A function of ``x``/``y`` float32 [-1, 4] with its isolation ``mode``, batch timeout
#: and memory limit as fields (0: none), restarted after 50 ms.
ISOLATED_MANIFEST = """
name = "{name}"
handler = "handler:H"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 4] }}

[isolation]
mode = "{mode}"
timeout_s = {timeout_s}
memory_limit_bytes = {memory_limit_bytes}
restart_backoff_s = 0.05
"""


#: A ``forward`` handler (its class ``cls``) in a worker process: x and y float32
#: [-1, 2], batches of up to 8, one instance and a deep queue.
FORWARD_WORKER_MANIFEST = """
name = "{name}"
handler = "handler:{cls}"

[inputs]
x = {{ dtype = "float32", shape = [-1, 2] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 2] }}

[batching]
max_batch_size = 8
max_wait_ms = 2

[scaling]
max_instances = 1
max_queue = 1024

[isolation]
mode = "process"
"""


#: A manifest that batches one request at a time (inputs and outputs undeclared), for a
#: handler written inline: ``.format(name=...)``, as write_function does.
BATCH_OF_ONE_MANIFEST = """
name = "{name}"
handler = "handler:handle"

[batching]
max_batch_size = 1
"""
ECHO_MANIFEST = """
name = "{name}"
handler = "handler:Echo"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 4] }}

[batching]
max_batch_size = {max_batch_size}

[scaling]
keep_alive_s = {keep_alive_s}
max_queue = {max_queue}
"""


def write_function(
    root: Path,
    name: str,
    handler: str = ECHO_HANDLER,
    manifest: str | None = None,
    files: dict[str, bytes] | None = None,
    **fields: Any,
) -> Path:
    """A function folder ``root/name`` with ``handler.py``, ``fnrt.toml`` and extra files.

    A handler that imports ``fnrt_test_gates`` at its top needs the test's memory,
    so it runs in a thread unless its manifest has an ``[isolation]`` table.
    """
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "handler.py").write_text(textwrap.dedent(handler))
    values = {"name": name, "max_batch_size": 8, "keep_alive_s": 300, "max_queue": 64, **fields}
    text = textwrap.dedent(manifest or ECHO_MANIFEST).format(**values)
    needs_gates = re.search(r"^import fnrt_test_gates", textwrap.dedent(handler), re.M)
    if needs_gates and "[isolation]" not in text:
        text += '\n[isolation]\nmode = "thread"\n'
    (folder / "fnrt.toml").write_text(text)
    for rel, data in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def packed(folder: Path, name: str | None = None) -> tuple[VersionManifest, Any]:
    manifest = load_manifest(folder, name=name)
    bundle = pack(folder, manifest)
    return VersionManifest(manifest, bundle.code_ref, bundle.artifacts), bundle


def publish(repository: Repository, folder: Path) -> VersionManifest:
    """Put a folder's blobs in the store and return its version manifest."""
    vm, bundle = packed(folder)
    for ref, source in bundle.blob_sources():
        repository.put_blob(ref.digest, source)
    return vm


def node_settings(tmp: Path, **settings: Any) -> ServerSettings:
    """Settings of a test node on ``tmp/store``: no sweeps unless a test asks."""
    values: dict[str, Any] = {"sweep_interval_s": 3600, **settings}
    return ServerSettings(store=str(tmp / "store"), cache_dir=tmp / "cache", **values)


def make_node(
    tmp: Path,
    clock: Clock | None = None,
    telemetry: Telemetry | None = None,
    *,
    keeper: Keeper | None = None,
    loader: InstanceLoader | None = None,
    **settings: Any,
) -> Node:
    """A node serving the folder store in ``tmp/store`` on the CPU (nothing runs yet)."""
    if loader is None:
        repository = Repository(FileStore(tmp / "store"))
        loader = InstanceLoader(repository, tmp / "cache", detect_device("cpu"))
    return build_node(
        node_settings(tmp, **settings),
        clock=clock,
        telemetry=telemetry,
        loader=loader,
        keeper=keeper,
        learn_keep_alive=keeper is not None,  # tests see the fixed keep-alive unless they ask
    )


class _Server(uvicorn.Server):
    """uvicorn's server, stopping as soon as it is told to: its main loop looks for
    ``should_exit`` every 0.1 s and its shutdown waits 0.1 s for connections even when
    there are none; a test suite starting hundreds of servers would wait a minute."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()
        self.exit_now: asyncio.Event | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.exit_now = asyncio.Event()
        await super().startup(sockets)
        self.ready.set()

    async def main_loop(self) -> None:
        assert self.exit_now is not None
        await self.on_tick(0)  # the Date header
        while not self.should_exit:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.exit_now.wait(), 1.0)
            await self.on_tick(0)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.server_state.connections:  # uvicorn's own: ask them to finish, then wait
            await super().shutdown(sockets)
            return
        for server in self.servers:
            server.close()
        await self._wait_tasks_to_complete()
        if not self.force_exit:
            await self.lifespan.shutdown()


class LiveServer:
    """A real uvicorn server (uvloop, httptools) on 127.0.0.1 and a free port, in a thread."""

    def __init__(self, app: Starlette, keep_alive_s: float = 5.0) -> None:
        self.app = app
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,
            loop="uvloop",
            http=guarded_protocol(
                connection_limits(app.state.node.settings), data_apps=data_apps(app)
            ),
            log_level="warning",
            lifespan="on",
            access_log=False,
            timeout_keep_alive=keep_alive_s,  # (uvicorn's default: 5)
        )
        self._server = _Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import uvloop

        self.loop = loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._server.serve(sockets=[self._sock]))
        finally:  # a loop left open keeps 6 descriptors: epoll, io_uring, eventfd, pipes...
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:  # (its default executor's threads are not waited for: a hung one)
                asyncio.set_event_loop(None)
                loop.close()

    def start(self) -> LiveServer:
        self._thread.start()
        if not self._server.ready.wait(30):
            raise RuntimeError("server did not start")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self.loop is not None and self._server.exit_now is not None:
            self.loop.call_soon_threadsafe(self._server.exit_now.set)
        self._thread.join(30)
        self._sock.close()

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30) -> T:
        """Run a coroutine on the server's event loop and return its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def deploy(self, folder: Path, **options: Any) -> Deployed:
        """Deploy the function in ``folder`` through the node's deployer, its blobs put in
        the store first (``options``: the deployer's, ``policy``); what it answered."""
        node = self.node
        return self.call(node.deployer.deploy(publish(node.repository, folder), **options))

    def open_connections(self) -> int:
        return len(self._server.server_state.connections)

    @property
    def node(self) -> Node:
        node: Node = self.app.state.node
        return node

    @property
    def registry(self) -> Registry:
        return self.node.registry

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, **kwargs)


@contextmanager
def live_server(
    tmp: Path,
    clock: Clock | None = None,
    node: Node | None = None,
    keep_alive_s: float = 5.0,
    **settings: Any,
) -> Iterator[LiveServer]:
    """Serve the store in ``tmp/store`` (a node built with ``clock``) until the block ends;
    an idle connection is closed after ``keep_alive_s``."""
    node = node or make_node(tmp, clock, **settings)
    server = LiveServer(build_app(node.settings, node), keep_alive_s).start()
    try:
        yield server
    finally:
        server.stop()


def assert_stages_add_up(timings: Mapping[str, float], share: float = 0.95) -> None:
    """A cold start's recorded stages (``describe``'s ``last_load_timings_s``, or an
    instance's ``timings_s``) sum to at least ``share`` of its ``total_s`` (#45), and
    not past it (rounded to the microsecond, as ``describe`` shows them)."""
    from fnrt.loader.instance import stage_sum

    total, covered = timings["total_s"], stage_sum(timings)
    assert covered >= share * total, f"the stages cover {covered / total:.1%}: {dict(timings)}"
    assert covered <= total + 1e-5, f"the stages sum past the total: {dict(timings)}"


async def instances_up(pool: Any, count: int, timeout_s: float = 5.0) -> None:
    """Until ``pool`` (an ``InstancePool``) holds ``count`` instances: its extra slots
    load in the background."""
    deadline = time.monotonic() + timeout_s
    while pool.instances < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert pool.instances == count, f"{pool.instances} instances, not {count}"


async def past_backoffs(done: asyncio.Future[Any], clock: Any, tries: int = 200) -> bool:
    """Advance the manual ``clock`` 5 s at a time (a failed load's backoff) until
    ``done`` is; whether it is."""
    for _ in range(tries):
        if done.done():
            return True
        clock.advance(5)
        await asyncio.sleep(0.02)
    return done.done()


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait for a condition another thread makes true (no fixed sleeps)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


@contextmanager
def made_folders() -> Iterator[list[Path]]:
    """The folders ``tempfile.mkdtemp`` makes in the block (``TemporaryDirectory``'s
    too), in order: what a test's own code made, where a look at all of ``/dev/shm`` or
    ``/tmp`` would also see the other tests' running beside it."""
    import tempfile

    made: list[Path] = []
    mkdtemp = tempfile.mkdtemp

    def recorded(*args: Any, **kwargs: Any) -> str:
        folder = mkdtemp(*args, **kwargs)
        made.append(Path(folder))
        return folder

    tempfile.mkdtemp = recorded  # type: ignore[assignment]
    try:
        yield made
    finally:
        tempfile.mkdtemp = mkdtemp


def open_fds() -> dict[int, str]:
    """This process's open descriptors and what each is (a path, ``pipe:[n]``...)."""
    fds: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return fds


def error_of(response: httpx.Response) -> dict[str, Any]:
    """An error body in whichever format the server chose for it."""
    if "msgpack" in response.headers.get("content-type", ""):
        import msgpack

        body: dict[str, Any] = msgpack.unpackb(response.content)
        return body
    body = response.json()
    return body


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a server started as a process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OtlpCollector:
    """An OTLP/HTTP collector on 127.0.0.1 (a free port) that keeps every
    ``ExportTraceServiceRequest`` posted to it, parsed with the official classes."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        received: list[Any] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    received.append(request)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.received = received
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def spans(self) -> list[tuple[str, Any]]:
        """(service name, span) of every span received so far."""
        out = []
        for request in list(self.received):
            for resource in request.resource_spans:
                service = next(
                    (
                        a.value.string_value
                        for a in resource.resource.attributes
                        if a.key == "service.name"
                    ),
                    "",
                )
                for scope in resource.scope_spans:
                    out += [(service, span) for span in scope.spans]
        return out

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def otlp_collector() -> Iterator[OtlpCollector]:
    collector = OtlpCollector()
    try:
        yield collector
    finally:
        collector.close()


@contextmanager
def traced_server(tmp: Path) -> Iterator[tuple[LiveServer, Any]]:
    """A live server whose spans go to an in-memory exporter, returned beside it."""
    from fnrt.tracing.export import MemoryExporter
    from fnrt.tracing.metrics import Metrics
    from fnrt.tracing.setup import TraceConfig, build_tracer
    from fnrt.tracing.spans import Tracing

    exporter = MemoryExporter()
    tracer = build_tracer(TraceConfig(), exporter, batch=False)
    node = make_node(tmp, telemetry=Telemetry(Tracing(tracer), Metrics(gpu=False)))
    server = LiveServer(build_app(node.settings, node)).start()
    try:
        yield server, exporter
    finally:
        server.stop()


@dataclass
class ServeProcess:
    """``fnrt serve`` as its own process: its URL, and the process."""

    url: str
    proc: subprocess.Popen[str]
    log: list[str]


def launch_serve(
    tmp: Path,
    *flags: str,
    env: dict[str, str] | None = None,
    nofile: int | None = None,
    scheme: str = "http",
) -> ServeProcess:
    """Start ``fnrt serve`` on a free port over ``tmp/store`` (open files capped at
    ``nofile``, soft and hard); :func:`wait_serving` waits for it to answer."""
    import resource

    def cap_files() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    port = free_port()
    argv = [sys.executable, "-m", "fnrt.runtime.cli.main", "serve", "--port", str(port)]
    argv += ["--store", str(tmp / "store"), "--cache-dir", str(tmp / "cache"), *flags]
    proc = subprocess.Popen(
        argv,
        env=os.environ | (env or {}),
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=cap_files,
    )
    log: list[str] = []
    # keep reading its log, so a full pipe never blocks the server
    threading.Thread(target=lambda: log.extend(proc.stderr or []), daemon=True).start()
    return ServeProcess(f"{scheme}://127.0.0.1:{port}", proc, log)


def wait_serving(server: ServeProcess, verify: Any = True) -> None:
    """Until ``/healthz`` answers; AssertionError with its log if it exits or takes 60 s."""
    deadline = time.monotonic() + 60
    while True:
        if server.proc.poll() is not None:
            raise AssertionError(
                f"fnrt serve exited with {server.proc.returncode}: {''.join(server.log)}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"fnrt serve did not answer in 60 s: {''.join(server.log)}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=1, verify=verify).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)


def stop_serve(server: ServeProcess) -> None:
    """SIGTERM, and SIGKILL past 30 s."""
    if server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(30)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


@contextmanager
def serve_process(
    tmp: Path,
    *flags: str,
    env: dict[str, str] | None = None,
    nofile: int | None = None,
    scheme: str = "http",
    verify: Any = True,
) -> Iterator[ServeProcess]:
    """``fnrt serve`` (see :func:`launch_serve`), answering, until the block ends."""
    server = launch_serve(tmp, *flags, env=env, nofile=nofile, scheme=scheme)
    try:
        wait_serving(server, verify)
        yield server
    finally:
        stop_serve(server)


def hostile_bundle(*entries: tuple[str, bytes | None, str | None]) -> bytes:
    """A .tar.gz of (name, data, symlink target) entries, as an attacker would write it."""
    import gzip
    import io
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data, link in entries:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = len(data or b"")
                tar.addfile(info, io.BytesIO(data or b""))
    return gzip.compress(raw.getvalue())


def s3_registry(tmp: Path, url: str, clock: Clock, memory_budget_bytes: int | None = None) -> Node:
    """A node over the S3 store at ``url`` (bucket fnrt, prefix fns) with a disk cache."""
    from s3support import FAST_RETRY

    from fnrt.loader.stores.s3 import S3Config, S3Store

    store = S3Store(
        "fnrt", "fns", S3Config(endpoint_url=url, retry=FAST_RETRY, part_size_bytes=5 * 2**20)
    )
    repository = Repository(store)
    cache = BlobCache(CacheConfig(tmp / "cache"))
    loader = InstanceLoader(repository, tmp / "cache", detect_device("cpu"), cache)
    return make_node(tmp, clock, loader=loader, memory_budget_bytes=memory_budget_bytes)


def listed_in_pages(repo: Repository, size: int) -> list[str]:
    """Every function's name, read ``size`` at a time after the last one read."""
    found: list[str] = []
    while True:
        page = repo.list_functions(found[-1] if found else "", size)
        found += page
        if len(page) < size:
            return found


#: A generative handler: each step emits the next integer after the prompt ``x``
#: (``n``, and its text). Parameters: ``until`` (done at that number), ``delay_ms``
#: (each step sleeps), ``fail_at`` (the step that reaches it raises). Step sizes go to
#: ``fnrt_test_gates.loads`` when the gates are importable (thread isolation).
COUNTER_HANDLER = """
import time
from fnrt.functions import Chunk, Generator

try:
    import fnrt_test_gates as gates
except ImportError:
    gates = None

class Counter(Generator):
    def start(self, sequences):
        for s in sequences:
            s.state = int(s.inputs["x"][0])
        return [self._emit(s) for s in sequences]

    def step(self, sequences):
        if gates is not None:
            gates.loads.append([(s.id, s.generated) for s in sequences])
        delay = max(float(s.parameters.get("delay_ms", 0)) for s in sequences)
        time.sleep(delay / 1000)
        return [self._emit(s) for s in sequences]

    def _emit(self, s):
        s.state += 1
        if s.parameters.get("fail_at") == s.state:
            raise ValueError(f"failed at {s.state}")
        until = s.parameters.get("until")
        done = until is not None and s.state >= until
        return Chunk({"n": [s.state], "text": [f"{s.state} ".encode()]}, done=done)
"""

COUNTER_MANIFEST = """
name = "{name}"
handler = "handler:Counter"

[inputs]
x = {{ dtype = "int64", shape = [1] }}

[outputs]
n = {{ dtype = "int64", shape = [1] }}
text = {{ dtype = "bytes", shape = [1] }}

[generation]
max_active = {max_active}
max_new_tokens = 50
max_prompt_tokens = 1
parameters = ["until", "delay_ms", "fail_at"]

[scaling]
max_queue = {max_queue}

[isolation]
mode = "{mode}"
"""


@dataclass
class Held:
    """A memory budget's resident, as a fake (``fnrt.loader.memory.Resident``): what it
    holds, when it was last used, whether it is busy; its eviction frees it all."""

    key: str
    resident_bytes: int
    last_active_s: float
    busy: bool = False
    evicted: bool = False

    async def evict(self) -> bool:
        self.evicted = True
        self.resident_bytes = 0
        return True


@dataclass
class OnGpu(Held):
    """A resident holding GPU memory too."""

    device_bytes: int = 0

    async def evict(self) -> bool:
        self.device_bytes = 0
        return await super().evict()
