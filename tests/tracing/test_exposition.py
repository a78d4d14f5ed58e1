"""fnrt's own writer of the Prometheus text format: line for line what
``prometheus_client`` writes, each label set's lines kept while unchanged, and
``/metrics`` sent a family at a time."""

from __future__ import annotations

import asyncio
import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fnrt.runtime.http.health import METRICS_CHUNK_BYTES, _exposition
from fnrt.tracing.exposition import Kept, chunks, number
from fnrt.tracing.metrics import (
    BATCH_BUCKETS,
    LATENCY_BUCKETS_S,
    FunctionState,
    LoopCounter,
    LoopHistogram,
    Metrics,
)

#: Label values that need escaping, and a label name sorted after ``le``.
ODD = 'a"b\\c\nd'


def without_created(text: bytes) -> bytes:
    """prometheus_client's text less its ``_created`` series (fnrt's series have none)."""
    kept = []
    for line in text.splitlines(keepends=True):
        words = line.split(b" ")
        name = words[2] if line.startswith(b"#") else words[0].split(b"{")[0]
        if not name.endswith(b"_created"):
            kept.append(line)
    return b"".join(kept)


def test_values_are_written_as_prometheus_client_writes_them() -> None:
    for value in (0, 1, 0.0005, 3.25, 999_999.0, 1e6, 12_345_678.0, 1.5e300, -2.5, math.inf):
        assert number(value) == generate_value(value)
    assert number(-math.inf) == "-Inf" and number(math.nan) == "NaN"


def generate_value(value: float) -> str:
    registry = CollectorRegistry()
    Gauge("g", "g", registry=registry).set(value)
    return generate_latest(registry).decode().splitlines()[-1].split(" ")[1]


def test_a_counter_is_written_byte_for_byte_as_prometheus_client_writes_it() -> None:
    doc = "What\\ it counts,\nper tier"
    ours = LoopCounter("fnrt_x", doc, ("function", "tier"))
    registry = CollectorRegistry()
    theirs = Counter("fnrt_x", doc, ["function", "tier"], registry=registry)
    for labels, amount in [
        (("a", "l2"), 1),
        (("a", "l3"), 2.5),
        ((ODD, "z"), 1e7),
        (("b", ODD), 3),
    ]:
        ours.inc(labels, amount)
    for labels in sorted(ours.values):  # theirs writes in the order label sets came
        theirs.labels(*labels).inc(ours.values[labels])
    assert b"".join(ours.lines()) == without_created(generate_latest(registry))


def test_a_histogram_is_written_byte_for_byte_as_prometheus_client_writes_it() -> None:
    for buckets in (LATENCY_BUCKETS_S, BATCH_BUCKETS):
        ours = LoopHistogram("fnrt_h", "Time to load", ("function", "tier"), buckets)
        registry = CollectorRegistry()
        theirs = Histogram(
            "fnrt_h", "Time to load", ["function", "tier"], buckets=buckets, registry=registry
        )
        seen = {
            ("a", "l2"): [0.0004, 0.0005, 3.0, 3.0, 61.0],
            (ODD, "l3"): [1.0, 2.0, 2_000_000.0],
            ("b", ODD): [0.0],
        }
        for labels, amounts in seen.items():
            ours.observe_each(ours.child(labels), amounts)
        for labels in sorted(seen):
            for amount in seen[labels]:
                theirs.labels(*labels).observe(amount)
        assert b"".join(ours.lines()) == without_created(generate_latest(registry))


def test_the_state_gauges_are_written_as_prometheus_client_writes_them() -> None:
    states = [FunctionState("b", "v-2", 2, 7, 1), FunctionState("a", ODD, 0, 0, 0, 3)]
    metrics = Metrics(gpu=False)
    metrics.watch(lambda: states)
    registry = CollectorRegistry()
    names = ("fnrt_warm_instances", "fnrt_queue_depth", "fnrt_running_batches")
    gauges = [
        Gauge(name, doc, ["function", "version"], registry=registry)
        for name, doc in (
            (names[0], "Loaded instances"),
            (names[1], "Requests waiting in the queue"),
            (names[2], "Batches running now"),
            ("fnrt_active_sequences", "Sequences of a generative function in a step batch now"),
        )
    ]
    for s in sorted(states, key=lambda s: (s.function, s.version)):
        for gauge, value in zip(gauges, (s.warm_instances, s.queued, s.running), strict=False):
            gauge.labels(s.function, s.version).set(value)
        if s.active_sequences:
            gauges[3].labels(s.function, s.version).set(s.active_sequences)
    text = metrics.exposition()
    assert text.endswith(generate_latest(registry))


def test_a_split_versions_tails_add_to_its_state() -> None:
    """A split version's tails are schedulers of the same function and version: their
    state adds to the version's (one series each, never the last one read alone)."""
    states = [
        FunctionState("cnn", "v-1", 2, 5, 1),  # the version
        FunctionState("cnn", "v-1", 1, 0, 0, 2),  # a tail
        FunctionState("mlp", "v-3", 0, 0),
    ]
    metrics = Metrics(gpu=False)
    metrics.watch(lambda: states)
    text = metrics.exposition().decode()
    lines = [line for line in text.splitlines() if 'function="cnn"' in line]
    assert lines == [
        'fnrt_warm_instances{function="cnn",version="v-1"} 3.0',
        'fnrt_queue_depth{function="cnn",version="v-1"} 5.0',
        'fnrt_running_batches{function="cnn",version="v-1"} 1.0',
        'fnrt_active_sequences{function="cnn",version="v-1"} 2.0',
    ]


def test_kept_writes_a_label_set_again_only_when_its_values_changed() -> None:
    written: list[tuple[str, ...]] = []

    def write(key: tuple[str, ...], values: list[float]) -> str:
        written.append(key)
        return f"{key[0]} {values}\n"

    kept: Kept[list[float]] = Kept(write, list.copy)
    series = {(f"f{i:02d}",): [0.0, float(i)] for i in range(20)}
    first = list(kept.lines(series))
    assert len(written) == 20 and first == sorted(first)
    written.clear()
    series[("f07",)][0] += 1  # changed in place, as a histogram's counts are
    again = list(kept.lines(series))
    assert written == [("f07",)]
    assert again[7] == b"f07 [1.0, 7.0]\n"
    assert all(again[i] is first[i] for i in range(20) if i != 7)  # kept, not written


def test_kept_follows_label_sets_added_and_gone() -> None:
    kept: Kept[float] = Kept(lambda key, value: f"{key[0]} {value}\n", float)
    series = {("b",): 1.0, ("d",): 2.0}
    assert kept.lines(series) == [b"b 1.0\n", b"d 2.0\n"]
    series[("a",)] = 3.0  # added: sorted in
    assert kept.lines(series) == [b"a 3.0\n", b"b 1.0\n", b"d 2.0\n"]
    del series[("b",)]  # one gone, one added: the same count of label sets
    series[("c",)] = 4.0
    assert kept.lines(series) == [b"a 3.0\n", b"c 4.0\n", b"d 2.0\n"]
    series.clear()
    assert kept.lines(series) == []
    series[("b",)] = 5.0  # back, with another value: written again, not the old line
    assert kept.lines(series) == [b"b 5.0\n"]


def test_chunks_join_parts_up_to_about_a_size() -> None:
    parts = [bytes([65 + i % 26]) * (i + 1) for i in range(50)]
    pieces = list(chunks(parts, 100))
    assert b"".join(pieces) == b"".join(parts)
    assert all(100 <= len(p) < 100 + 50 for p in pieces[:-1])
    assert list(chunks([], 100)) == []


def test_metrics_are_sent_a_family_at_a_time_with_the_loop_serving_between() -> None:
    """A node of a thousand functions' /metrics: the body in pieces of about
    METRICS_CHUNK_BYTES, the same bytes as made at once, and a task of the loop runs
    between families rather than waiting for the whole body."""
    metrics = Metrics(gpu=False)
    states = []
    for i in range(1000):
        name = f"fn-{i:04d}"
        metrics.request(name, "v1", 200, 0.003)
        metrics.batch(name, 1, 0.001, [0.0005])
        metrics.load(name, "l2", 1_000, 0.02)
        states.append(FunctionState(name, "v1", 1, 0))
    metrics.watch(lambda: states)

    async def scrape() -> tuple[list[bytes], int]:
        turns = 0
        done = False

        async def other() -> None:
            nonlocal turns
            while not done:
                turns += 1
                await asyncio.sleep(0)

        task = asyncio.ensure_future(other())
        await asyncio.sleep(0)
        turns = 0
        pieces = [piece async for piece in _exposition(metrics)]
        done = True
        await task
        return pieces, turns

    pieces, turns = asyncio.run(scrape())
    sent, whole = b"".join(pieces), metrics.exposition()
    ours = b"# HELP fnrt_requests_total"  # before it: process figures, which move
    assert sent[sent.index(ours) :] == whole[whole.index(ours) :]
    assert len(pieces) > 10 and max(map(len, pieces)) < 2 * METRICS_CHUNK_BYTES
    families = sum(1 for _ in metrics.families())
    assert turns >= families - 1
