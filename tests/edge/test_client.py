"""The edge client against a real server: every split, the planner under emulated
links, the offline fallback, verified heads, one trace, and its few dependencies."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from fnrt.edge.activation import Encoding
from fnrt.edge.client import EdgeClient, EdgeConfig, EdgeUnavailable
from fnrt.edge.transport import HttpTransport, Response, Throttled, Transport
from fnrt.functions.errors import IntegrityError, InvalidInput, NoSuchSplit
from fnrt.functions.headers import SERVER_MS_HEADER
from fnrt.tracing.export import MemoryExporter
from fnrt.tracing.recorder import SpanKind
from fnrt.tracing.setup import TraceConfig, build_tracer
from support import LiveServer, live_server, publish, traced_server

NAME = "cnn-split"
X = np.random.default_rng(5).random((1, 3, 32, 32), dtype=np.float32)
#: Tolerance of each encoding, relative to the largest output.
TOLERANCE = {Encoding.FLOAT32: 1e-5, Encoding.FLOAT16: 1e-2, Encoding.INT8: 5e-2}


@pytest.fixture
def server(tmp_path: Path, cnn: Path) -> Iterator[LiveServer]:
    with live_server(tmp_path) as srv:
        srv.call(srv.node.deployer.deploy(publish(srv.node.repository, cnn)))
        yield srv


def whole(cnn: Path, x: np.ndarray = X) -> np.ndarray:
    session = ort.InferenceSession(str(cnn / "model.onnx"), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


@pytest.mark.parametrize("encoding", list(Encoding))
def test_every_split_gives_the_models_result(
    server: LiveServer, cnn: Path, tmp_path: Path, encoding: Encoding
) -> None:
    expected = whole(cnn)
    config = EdgeConfig(cache_dir=tmp_path / "edge", encoding=encoding, profile_runs=1)
    with EdgeClient(server.url, NAME, config) as client:
        assert client.splits == 8
        for k in range(client.splits):
            result = client.run({"x": X}, split=k)
            assert result.split == k and not result.offline
            error = float(np.abs(result.outputs["y"] - expected).max())
            assert error <= TOLERANCE[encoding] * max(float(np.abs(expected).max()), 1.0), k
        with pytest.raises(NoSuchSplit, match="not one of 0 to 7"):
            client.run({"x": X}, split=8)


class VirtualTime:
    """The one clock of an emulated world: the link, the device and the server take the
    time they are given, never what the load of this machine makes of it."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def now(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += max(seconds, 0.0)


class EmulatedServer:
    """The real server, its time the world's: a tail from split ``k`` takes the
    segments ``k`` on of ``segment_ms``, said in ``x-fnrt-server-ms`` as the server
    says its own; other requests take none. Its plan data says those times too, and
    no queue: what the server measured as it cut the model moves with this machine's
    load (a first segment timed at 0 under load made split 3 beat the whole model on
    the server on a fast link), and the world is the same on every run."""

    def __init__(self, inner: Transport, time: VirtualTime, segment_ms: list[float]) -> None:
        self.inner, self.time, self.segment_ms = inner, time, segment_ms

    def request(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str]
    ) -> Response:
        response = self.inner.request(method, path, body, headers)
        if method == "GET" and path == f"/v1/functions/{NAME}/split" and response.status == 200:
            data = {**json.loads(response.body), "server_ms": self.segment_ms, "server_wait_ms": 0}
            response = Response(200, response.headers, json.dumps(data).encode())
        tail = re.fullmatch(rf"/v1/functions/{NAME}/split/(\d+)", path)
        server_ms = sum(self.segment_ms[int(tail[1]) :]) if tail and method == "POST" else 0.0
        self.time.sleep(server_ms / 1000.0)
        answered = {**response.headers, SERVER_MS_HEADER: f"{server_ms:.4f}"}
        return Response(response.status, answered, response.body)


class _SlowHead:
    """A head's onnxruntime session on the emulated device: it runs for real (its
    outputs are the model's), and takes ``ms`` of the world's time."""

    def __init__(self, session: Any, ms: float, time: VirtualTime) -> None:
        self.session, self.ms, self.time = session, ms, time

    def run(self, outputs: list[str] | None, feed: dict[str, np.ndarray]) -> Any:
        ran = self.session.run(outputs, feed)
        self.time.sleep(self.ms / 1000.0)
        return ran


class EmulatedDevice(EdgeClient):
    """A client on a device ``SLOWDOWN`` times slower than the server, on the world's
    clock: the head of split ``k`` takes that many times the server's segments before
    ``k``."""

    world: VirtualTime
    segment_ms: list[float]

    def _load_heads(self, *, online: bool) -> None:
        super()._load_heads(online=online)
        for k, session in list(self._sessions.items()):
            ms = SLOWDOWN * sum(self.segment_ms[:k])
            self._sessions[k] = _SlowHead(session, ms, self.world)


#: How much slower than the server the emulated device runs the model.
SLOWDOWN = 30
#: The server's time of each of the model's segments (ms) in the emulated world: as
#: this machine measured them unloaded, rounded (the fourth, timed at 0 there, 0.004).
SEGMENT_MS = (0.086, 0.012, 0.029, 0.004, 0.11, 0.08, 0.019)


def cached_heads(server: LiveServer, tmp_path: Path) -> Path:
    """A device cache holding the plan and every head, fetched over the real link."""
    cache = tmp_path / "edge"
    with EdgeClient(server.url, NAME, EdgeConfig(cache_dir=cache)) as warm:
        warm.plan()
    return cache


def emulated(
    server: LiveServer, cache: Path, bandwidth: float, emulate_slowdown: float = 1.0
) -> tuple[EmulatedDevice, Throttled, VirtualTime]:
    """A device ``SLOWDOWN`` times slower than the server, behind a link of
    ``bandwidth`` and 5 ms RTT, all on one virtual clock (the heads already cached)."""
    segment_ms = list(SEGMENT_MS)
    world = VirtualTime()
    server_side = EmulatedServer(HttpTransport(server.url), world, segment_ms)
    link = Throttled(server_side, bandwidth, rtt_ms=5, sleep=world.sleep)
    client = EmulatedDevice(
        server.url,
        NAME,
        EdgeConfig(cache_dir=cache, emulate_slowdown=emulate_slowdown),
        transport=link,
        clock=world.now,
        timer=world.now,
        sleep=world.sleep,
    )
    client.world, client.segment_ms = world, segment_ms
    return client, link, world


@pytest.mark.parametrize("bandwidth", [50e3, 1e6, 20e6])  # 400x from the slowest to the fastest
def test_the_planned_split_is_within_ten_percent_of_the_best_measured(
    server: LiveServer, cnn: Path, tmp_path: Path, bandwidth: float
) -> None:
    """The client plans on what it measures (the link from its calls and probes, each
    head here once) and meets what each split then takes: on a virtual clock, so a
    busy machine moves nothing (the model, the server and the bytes are real)."""
    cache = cached_heads(server, tmp_path)  # the heads (2.6 MB), at full speed
    client, _, _ = emulated(server, cache, bandwidth)
    with client:
        first = client.plan().split  # from one probe and the heads' profile
        times: list[list[float]] = [[] for _ in range(client.splits)]
        for _ in range(3):  # splits in turn, as a device trying them would
            for k in range(client.splits):
                times[k].append(client.run({"x": X}, split=k).total_ms)
        measured = [statistics.median(t) for t in times]
        assert all(max(t) - min(t) < 1e-6 for t in times), times  # the world's own times
        chosen = client.plan().split  # having learned from those calls, as in use
        best = min(measured)
        predicted = [round(t, 1) for t in client.plan().predicted_ms]
        report = (first, chosen, [round(t, 1) for t in measured], predicted, client.link.link)
        assert measured[chosen] <= 1.10 * best, report
        assert measured[first] <= 1.5 * best, report  # even the first guess is close
        assert client.run({"x": X}).split == client.plan().split  # run() follows the plan
        expected = whole(cnn)  # and its outputs are the model's, whatever the clock
        error = float(np.abs(client.run({"x": X}).outputs["y"] - expected).max())
        assert error <= TOLERANCE[client.config.encoding] * max(float(np.abs(expected).max()), 1)


def test_offline_it_runs_the_whole_model_here(tmp_path: Path, cnn: Path) -> None:
    cache = tmp_path / "edge"
    expected = whole(cnn)
    with live_server(tmp_path) as srv:
        srv.call(srv.node.deployer.deploy(publish(srv.node.repository, cnn)))
        url = srv.url
        client = EdgeClient(url, NAME, EdgeConfig(cache_dir=cache, profile_runs=1))
        assert not client.run({"x": X}, split=3).offline
        small = EdgeClient(
            url, NAME, EdgeConfig(cache_dir=tmp_path / "small", max_model_bytes=50_000)
        )
        small.plan()  # it holds only the heads up to 50 kB, not the whole model
    # the server is gone
    result = client.run({"x": X}, split=3)
    assert result.offline and result.split == 7
    np.testing.assert_allclose(result.outputs["y"], expected, atol=1e-5)
    # a new process on the device: the plan and heads it cached are enough
    again = EdgeClient(url, NAME, EdgeConfig(cache_dir=cache, profile_runs=1)).run({"x": X})
    assert again.offline
    np.testing.assert_allclose(again.outputs["y"], expected, atol=1e-5)
    with pytest.raises(EdgeUnavailable, match="is not on this device"):
        small.run({"x": X})
    with pytest.raises(EdgeUnavailable, match="cannot reach the server"):
        EdgeClient(url, NAME, EdgeConfig(cache_dir=tmp_path / "never")).run({"x": X})


def test_a_corrupted_head_is_never_run(server: LiveServer, tmp_path: Path, cnn: Path) -> None:
    cache = tmp_path / "edge"
    with EdgeClient(server.url, NAME, EdgeConfig(cache_dir=cache, profile_runs=1)) as client:
        digest = next(h["digest"] for h in client.data["heads"] if h["k"] == 3)
    cached = cache / "heads" / f"{digest}.onnx"
    cached.write_bytes(cached.read_bytes()[:-100] + bytes(100))  # corrupted on the device
    with EdgeClient(server.url, NAME, EdgeConfig(cache_dir=cache, profile_runs=1)) as client:
        result = client.run({"x": X}, split=3)  # fetched again, verified, then run
        np.testing.assert_allclose(result.outputs["y"], whole(cnn), atol=1e-5)
    # corrupted on the way (here: in the server's own cut file, after it was digested)
    (served,) = (tmp_path / "cache" / "split").glob("*/head-3.onnx")
    served.write_bytes(served.read_bytes()[:-100] + bytes(100))
    fresh = tmp_path / "fresh"
    with pytest.raises(IntegrityError, match=f"expected sha256:{digest}"):
        EdgeClient(server.url, NAME, EdgeConfig(cache_dir=fresh)).plan()
    assert not (fresh / "heads" / f"{digest}.onnx").exists()


def test_edge_and_server_spans_make_one_trace(tmp_path: Path, cnn: Path) -> None:
    edge_spans = MemoryExporter()
    with traced_server(tmp_path) as (srv, server_spans):
        srv.call(srv.node.deployer.deploy(publish(srv.node.repository, cnn)))
        edge_tracer = build_tracer(TraceConfig(service_name="edge"), edge_spans, batch=False)
        config = EdgeConfig(cache_dir=tmp_path / "edge", profile_runs=1)
        with EdgeClient(srv.url, NAME, config, tracer=edge_tracer) as client:
            client.run({"x": X}, split=3)
    (run,) = edge_spans.named("edge.run")
    (head,) = edge_spans.named("edge.head")
    (upload,) = edge_spans.named("edge.upload")
    assert head.parent == run.context and upload.parent == run.context
    assert upload.kind is SpanKind.CLIENT and upload.attributes["fnrt.split"] == 3
    (served,) = [s for s in server_spans.spans if s.kind is SpanKind.SERVER and "split" in s.name]
    assert served.context.trace_id == run.context.trace_id
    assert served.parent is not None and served.parent.span_id == upload.context.span_id
    assert served.attributes["fnrt.split"] == 3
    inner = {s.name for s in server_spans.spans if s.context.trace_id == run.context.trace_id}
    assert {"queue", "load"} <= inner  # its wait, and the tail's load it waited for
    assert any(served.context in s.links for s in server_spans.spans)  # the batch it ran in


BLOCKER = """
import importlib.abc, sys
BLOCKED = {"torch", "onnx", "starlette", "uvicorn", "httpx", "orjson", "ml_dtypes", "boto3"}

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED or name.startswith(("fnrt.runtime", "fnrt.loader")):
            raise ImportError(f"{name} is not on this device")
        return None

sys.meta_path.insert(0, Block())
"""


def test_the_client_needs_only_numpy_msgpack_and_onnxruntime(
    server: LiveServer, tmp_path: Path
) -> None:
    script = BLOCKER + textwrap.dedent(f"""
        import numpy as np
        from pathlib import Path
        from fnrt.edge.client import EdgeClient, EdgeConfig
        config = EdgeConfig(cache_dir=Path({str(tmp_path / "edge")!r}), profile_runs=1)
        with EdgeClient({server.url!r}, "cnn-split", config) as client:
            result = client.run({{"x": np.zeros((1, 3, 32, 32), np.float32)}}, split=3)
        print(result.split, result.outputs["y"].shape)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "(1,", "10)"]


def retrain(model: Path) -> None:
    """Change the first layer's bias in place (as a retrained model would)."""
    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(model))
    bias = next(t for t in proto.graph.initializer if t.name == "0.bias")
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + 0.01, bias.name))
    onnx.save(proto, str(model))


def test_during_a_split_of_traffic_a_device_keeps_to_its_plans_version(
    tmp_path: Path, cnn: Path
) -> None:
    folder = tmp_path / "cnn-split"
    shutil.copytree(cnn, folder)
    with live_server(tmp_path) as srv:
        first = srv.call(srv.node.deployer.deploy(publish(srv.node.repository, folder))).version
        retrain(folder / "model.onnx")  # new weights: every head differs
        second = srv.call(srv.node.deployer.deploy(publish(srv.node.repository, folder))).version
        srv.call(srv.node.deployer.set_traffic(NAME, {first: 50, second: 50}))
        seen = set()
        for i in range(4):  # heads, plan and tails all of one version, whichever it is
            config = EdgeConfig(cache_dir=tmp_path / f"edge-{i}", profile_runs=1)
            with EdgeClient(srv.url, NAME, config) as client:
                result = client.run({"x": X}, split=3)
                seen.add(result.version)
        assert seen <= {first, second}


def test_an_emulated_slowdown_makes_every_model_run_here_that_many_times_as_long(
    server: LiveServer, tmp_path: Path
) -> None:
    cache = cached_heads(server, tmp_path)
    plain, _, _ = emulated(server, cache, 1e6)
    slowed, _, _ = emulated(server, cache, 1e6, emulate_slowdown=4)
    with plain, slowed:
        for k in (1, plain.splits // 2, plain.splits - 1):  # heads, and the whole model
            ran, ran_slowly = plain.run({"x": X}, split=k), slowed.run({"x": X}, split=k)
            assert ran.head_ms > 0 and ran_slowly.head_ms == pytest.approx(4 * ran.head_ms)
        assert slowed.profile().device_ms == pytest.approx(
            tuple(4 * t for t in plain.profile().device_ms)
        )


def test_the_client_plans_again_when_the_link_slows_down(
    server: LiveServer, tmp_path: Path
) -> None:
    cache = cached_heads(server, tmp_path)
    client, link, _ = emulated(server, cache, 20e6)
    with client:
        assert client.run({"x": X}).split == 0  # a fast link: all on the server
        link.bandwidth_bytes_per_s = 20e3  # the link degrades under it (well past the
        # tie of split 3 and all-on-device, near 50 kB/s)
        splits = [client.run({"x": X}).split for _ in range(12)]
        assert splits[-1] == client.splits - 1, splits  # all on the device now
        estimate = client.link.link
        assert estimate is not None and estimate.bandwidth_bytes_per_s < 200e3


class Ticks:
    """A virtual clock the test moves (when the client's plan data is due again)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_fixed_split_moves_to_a_new_deploy_and_past_a_version_gone(
    tmp_path: Path, cnn: Path
) -> None:
    """With ``split`` fixed the plan is not chosen, but the server's versions are still
    followed: a new deploy once the plan data is due, and at once when the version it
    used is gone (deleted, then deployed anew: 404, the plan again)."""
    folder = tmp_path / "cnn-split"
    shutil.copytree(cnn, folder)
    ticks = Ticks()
    with live_server(tmp_path) as srv:
        deployer, repository = srv.node.deployer, srv.node.repository
        first = srv.call(deployer.deploy(publish(repository, folder))).version
        config = EdgeConfig(cache_dir=tmp_path / "edge", profile_runs=1, split=3)
        with EdgeClient(srv.url, NAME, config, clock=ticks) as client:
            assert client.run({"x": X}).version == first
            retrain(folder / "model.onnx")
            second = srv.call(deployer.deploy(publish(repository, folder))).version
            ticks.now += 2 * config.plan_refresh_s
            assert client.run({"x": X}).version == second
            srv.call(deployer.delete(NAME))
            retrain(folder / "model.onnx")
            third = srv.call(deployer.deploy(publish(repository, folder))).version
            assert client.run({"x": X}).version == third  # no time passed: by its 404
            np.testing.assert_allclose(
                client.run({"x": X}).outputs["y"], whole(folder), rtol=1e-4, atol=1e-5
            )


def test_an_input_of_the_wrong_shape_is_refused_in_the_clients_words(
    server: LiveServer, tmp_path: Path
) -> None:
    """At any split, here or offline, an input that is not the model's shape is an
    InvalidInput that names it, before any head runs (not onnxruntime's traceback from
    inside one), and the client serves the next call."""
    config = EdgeConfig(cache_dir=tmp_path / "edge", profile_runs=1)
    with EdgeClient(server.url, NAME, config) as client:
        for k in (0, 3, client.splits - 1):
            for bad in (X[0], X[:, :, :16], np.zeros((0, 3, 32, 32), np.float32)):
                with pytest.raises(
                    InvalidInput, match=r"input 'x' must have shape \[n, 3, 32, 32\]"
                ):
                    client.run({"x": bad}, split=k)
            with pytest.raises(InvalidInput, match="not float32"):
                client.run({"x": [["a"]]}, split=k)
        assert client.run({"x": X}, split=3).outputs["y"].shape == (1, 10)
