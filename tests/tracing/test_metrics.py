"""``/metrics`` after real traffic, read back with prometheus_client's own parser."""

from __future__ import annotations

import io
import itertools
import socket
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fnrt.runtime.http.app import build_app
from fnrt.tracing.access import AccessLog
from fnrt.tracing.metrics import LoopHistogram, Metrics
from fnrt.tracing.spans import Tracing
from fnrt.tracing.telemetry import Telemetry
from support import LiveServer, make_node, write_function

X = [[1.0, 2.0, 3.0, 4.0]]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_count_requests_batches_and_cold_starts(tmp_path: Path) -> None:
    log = io.BytesIO()
    telemetry = Telemetry(Tracing(), Metrics(gpu=False), AccessLog(log, interval_s=3600))
    node = make_node(tmp_path, telemetry=telemetry)
    server = LiveServer(build_app(node.settings, node)).start()
    try:
        folder = write_function(tmp_path / "src", "echo")
        version = server.deploy(folder).version
        with server.client() as c:
            for _ in range(5):
                assert c.post("/v1/functions/echo/invoke", json={"x": X}).status_code == 200
            assert c.post("/v1/functions/echo/invoke", json={"x": [[1]]}).status_code == 422
            assert c.post("/v1/functions/nope/invoke", json={"x": X}).status_code == 404
            r = c.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        found = samples(r.text)
    finally:
        server.stop()

    def value(name: str, **labels: str) -> float:
        return found[(name, tuple(sorted(labels.items())))]

    assert value("fnrt_requests_total", function="echo", version=version, status="200") == 5
    assert value("fnrt_requests_total", function="echo", version=version, status="422") == 1
    assert value("fnrt_requests_total", function="", version="", status="404") == 1
    assert value("fnrt_request_duration_seconds_count", function="echo") == 6
    # buckets are cumulative and end at +Inf with every observation
    buckets = sorted(
        (float(dict(labels)["le"]), v)
        for (name, labels), v in found.items()
        if name == "fnrt_request_duration_seconds_bucket" and dict(labels)["function"] == "echo"
    )
    assert buckets[-1] == (float("inf"), 6)
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(buckets))
    assert value("fnrt_batch_size_count", function="echo") == 5
    assert value("fnrt_batch_size_bucket", function="echo", le="1.0") == 5
    assert value("fnrt_queue_wait_seconds_count", function="echo") == 5
    assert value("fnrt_batch_compute_duration_seconds_count", function="echo") == 5
    tiers = {dict(k[1])["tier"]: v for k, v in found.items() if k[0] == "fnrt_cold_starts_total"}
    assert sum(tiers.values()) == 1 and set(tiers) <= {"l2", "l3"}
    assert value("fnrt_cache_hits_total", tier="l1") == 4  # the other 4 found it loaded
    assert value("fnrt_warm_instances", function="echo", version=version) == 1
    assert value("fnrt_queue_depth", function="echo", version=version) == 0
    assert value("fnrt_running_batches", function="echo", version=version) == 0
    assert value("process_resident_memory_bytes") > 0
    assert telemetry.access is not None
    telemetry.access.flush()
    lines = [orjson.loads(line) for line in log.getvalue().splitlines()]
    assert len(lines) == 7
    fields = lines[0]
    assert fields["logger"] == "fnrt.access" and fields["ts"].endswith("Z")
    assert fields["function"] == "echo" and fields["status"] == 200
    assert fields["route"] == "/v1/functions/{name}/invoke" and fields["duration_ms"] > 0
    assert "cold_start" in fields and "trace_id" not in fields  # tracing is off here


def test_a_version_unloaded_reports_none_warm_and_leaves_the_device_gauge(
    tmp_path: Path,
) -> None:
    """The state gauges read a version's instances only where its pool holds one
    (``Holders``): one called then unloaded still has its rows, at 0, beside one warm,
    and a scrape after a call shows what changed (the lines kept from the last)."""
    node = make_node(tmp_path, telemetry=Telemetry(Tracing(), Metrics(gpu=False), None))
    server = LiveServer(build_app(node.settings, node)).start()
    try:
        warm = server.deploy(write_function(tmp_path / "src", "warm")).version
        cold = server.deploy(write_function(tmp_path / "src", "cold")).version
        with server.client() as c:
            for name in ("warm", "cold"):
                assert c.post(f"/v1/functions/{name}/invoke", json={"x": X}).status_code == 200
            first = samples(c.get("/metrics").text)
            assert c.post("/v1/functions/cold/unload").status_code == 200
            assert c.post("/v1/functions/warm/invoke", json={"x": X}).status_code == 200
            found = samples(c.get("/metrics").text)
    finally:
        server.stop()

    def value(
        got: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
    ) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    assert value(first, "fnrt_warm_instances", function="cold", version=cold) == 1
    assert value(found, "fnrt_warm_instances", function="cold", version=cold) == 0
    assert value(found, "fnrt_running_batches", function="cold", version=cold) == 0
    assert value(found, "fnrt_queue_depth", function="cold", version=cold) == 0
    assert value(found, "fnrt_warm_instances", function="warm", version=warm) == 1
    on_device = {dict(k[1])["function"] for k in found if k[0] == "fnrt_instances_on_device"}
    assert on_device == {"warm"}
    requests = "fnrt_requests_total"
    assert value(first, requests, function="warm", version=warm, status="200") == 1
    assert value(found, requests, function="warm", version=warm, status="200") == 2
    assert value(found, requests, function="cold", version=cold, status="200") == 1


def test_a_deleted_function_leaves_no_series_behind(tmp_path: Path) -> None:
    """A node that serves functions made and deleted all day keeps no series of those
    gone (nor the lines the scrape kept of them); one deployed again under the same
    name counts from the start; the others keep theirs."""
    node = make_node(tmp_path, telemetry=Telemetry(Tracing(), Metrics(gpu=False), None))
    server = LiveServer(build_app(node.settings, node)).start()
    try:
        folder = write_function(tmp_path / "src", "gone")
        server.deploy(folder)
        kept = server.deploy(write_function(tmp_path / "src", "kept")).version
        with server.client() as c:
            for name in ("gone", "kept"):
                assert c.post(f"/v1/functions/{name}/invoke", json={"x": X}).status_code == 200
            before = c.get("/metrics").text
            assert c.delete("/v1/functions/gone").status_code == 200
            after = c.get("/metrics").text
            again = server.deploy(folder).version
            assert c.post("/v1/functions/gone/invoke", json={"x": X}).status_code == 200
            reborn = samples(c.get("/metrics").text)
    finally:
        server.stop()
    assert 'function="gone"' in before
    assert 'function="gone"' not in after, [m for m in after.splitlines() if '"gone"' in m]
    found = samples(after)
    assert (
        found[("fnrt_requests_total", (("function", "kept"), ("status", "200"), ("version", kept)))]
        == 1
    )
    assert found[("fnrt_request_duration_seconds_count", (("function", "kept"),))] == 1
    assert (
        reborn[
            ("fnrt_requests_total", (("function", "gone"), ("status", "200"), ("version", again)))
        ]
        == 1
    )
    assert reborn[("fnrt_request_duration_seconds_count", (("function", "gone"),))] == 1
    loads = [
        v
        for (name, labels), v in reborn.items()
        if name == "fnrt_cold_starts_total" and ("function", "gone") in labels
    ]
    assert loads == [1]


def test_metrics_come_in_chunks_and_whole_to_an_http_1_0_client(tmp_path: Path) -> None:
    """HTTP/1.1 gets /metrics chunked, as it is made; HTTP/1.0, which knows no chunks,
    gets the same text whole with its length."""
    node = make_node(tmp_path, telemetry=Telemetry(Tracing(), Metrics(gpu=False), None))
    server = LiveServer(build_app(node.settings, node)).start()
    try:
        heads = {}
        bodies = {}
        for version in ("1.0", "1.1"):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                ask = f"GET /metrics HTTP/{version}\r\nHost: x\r\nConnection: close\r\n\r\n"
                sock.sendall(ask.encode())
                answer = b""
                while chunk := sock.recv(1 << 16):
                    answer += chunk
            head, _, body = answer.partition(b"\r\n\r\n")
            heads[version], bodies[version] = head.decode().lower(), body
    finally:
        server.stop()
    assert "transfer-encoding: chunked" in heads["1.1"]
    assert "transfer-encoding" not in heads["1.0"]
    assert f"content-length: {len(bodies['1.0'])}" in heads["1.0"]
    names = {f.name for f in text_string_to_metric_families(bodies["1.0"].decode())}
    assert {"fnrt_requests", "fnrt_warm_instances", "process_resident_memory_bytes"} <= names


def test_kept_children_count_per_label_set() -> None:
    metrics = Metrics(gpu=False)
    for status in (200, 200, 429):
        metrics.request("a", "v1", status, 0.01)
    metrics.request("b", "v1", 200, 0.02)
    metrics.start("a", "cold")
    metrics.start("a", "warm")
    metrics.start("a", "warm")
    metrics.batch("a", 3, 0.005, [0.001, 0.002, 0.003])
    got = samples(metrics.exposition().decode())
    requests = "fnrt_requests_total"
    assert got[(requests, (("function", "a"), ("status", "200"), ("version", "v1")))] == 2
    assert got[(requests, (("function", "a"), ("status", "429"), ("version", "v1")))] == 1
    assert got[(requests, (("function", "b"), ("status", "200"), ("version", "v1")))] == 1
    assert got[("fnrt_request_duration_seconds_count", (("function", "a"),))] == 3
    assert got[("fnrt_invocation_starts_total", (("function", "a"), ("kind", "warm")))] == 2
    assert got[("fnrt_queue_wait_seconds_count", (("function", "a"),))] == 3


def test_the_request_path_series_read_as_prometheus_counters_and_histograms() -> None:
    """The lock-free series the request path updates expose what prometheus_client's
    would: a ``_total`` counter, and histograms with cumulative ``le`` buckets, a
    count and a sum, parsed back by prometheus_client's own parser."""
    metrics = Metrics(gpu=False)
    for seconds in (0.0004, 0.0005, 0.003, 0.003, 99.0):
        metrics.request("f", "v1", 200, seconds)
    metrics.request("f", "v1", 503, 0.002)
    metrics.batch("f", 3, 0.02, [0.001, 0.0002, 0.5])
    metrics.start("f", "warm")
    metrics.start("f", "warm")
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    requests = {s.labels["status"]: s.value for s in families["fnrt_requests"].samples}
    assert requests == {"200": 5.0, "503": 1.0}
    samples = families["fnrt_request_duration_seconds"].samples
    buckets = {s.labels["le"]: s.value for s in samples if s.name.endswith("_bucket")}
    assert buckets["0.0005"] == 2  # le is inclusive
    assert buckets["0.0025"] == 3 and buckets["0.005"] == 5 and buckets["60.0"] == 5
    assert buckets["+Inf"] == 6
    (count,) = [s.value for s in samples if s.name.endswith("_count")]
    (total,) = [s.value for s in samples if s.name.endswith("_sum")]
    assert count == 6 and total == pytest.approx(0.0004 + 0.0005 + 0.006 + 99.0 + 0.002)
    queue = families["fnrt_queue_wait_seconds"].samples
    assert [s.value for s in queue if s.labels.get("le") == "0.001"] == [2]
    sizes = families["fnrt_batch_size"].samples
    assert [s.value for s in sizes if s.name.endswith("_sum")] == [3]
    starts = families["fnrt_invocation_starts"].samples
    assert [(s.labels["kind"], s.value) for s in starts] == [("warm", 2.0)]


def test_a_batch_of_observations_counts_as_each_one_would() -> None:
    waits = [0.0, 0.004, 0.005, 0.2, 7.0]
    one, each = (LoopHistogram("h", "waits", ("f",), (0.005, 0.1, 1.0)) for _ in range(2))
    for wait in waits:
        one.observe(one.child(("a",)), wait)
    each.observe_each(each.child(("a",)), waits)
    assert each.series == one.series
    assert each.series[("a",)][:4] == [3, 0, 1, 1]  # le 0.005 (bounds are inclusive), ..., +Inf


def test_the_store_series_count_its_requests_and_the_reads_refused() -> None:
    refused = [0]
    metrics = Metrics(gpu=False)
    metrics.watch_store(lambda: {"GetObject": 2}, lambda: refused[0])
    refused[0] = 3  # read at the scrape
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for s in family.samples
    }
    assert samples[("fnrt_store_requests_total", (("operation", "GetObject"),))] == 2
    assert samples[("fnrt_store_reads_refused_total", ())] == 3
