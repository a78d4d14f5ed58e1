"""Prometheus metrics for ``GET /metrics``, on a registry of the server's own.

The series kept per function are lock-free (:class:`LoopCounter`,
:class:`LoopHistogram`: a dict add, a bisect), since only the event loop's
thread updates them, and written at scrape by fnrt (``exposition.py``: each
label set's lines kept while unchanged, so a node of thousands of functions
scrapes in milliseconds); the few others are ``prometheus_client``'s (a lock
and an add each); gauges that describe state (warm instances, queue depth,
memory, GPU) are read when ``/metrics`` is scraped, from a callback the
runtime gives.
Names follow Prometheus conventions: ``fnrt_`` prefix, base units
(seconds, bytes), ``_total`` for counters.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import chain
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector

from fnrt.tracing.exposition import Kept, bucket_labels, header, number
from fnrt.tracing.exposition import labels as label_text

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Request latencies from a cache hit (~100 µs) to a cold start from the store (~minutes).
LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: Time per output token of a generative function: from a tiny model (~1 ms) to a large one.
TOKEN_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0,
)  # fmt: skip


class FunctionState(NamedTuple):
    """What a scrape reports of one function version held (a tuple: a node makes one
    for each of up to thousands of versions at every scrape)."""

    function: str
    version: str
    warm_instances: int
    queued: int
    running: int = 0  # batches running now
    active_sequences: int = 0  # generative functions: sequences in a step batch now


StateSource = Callable[[], Iterable[FunctionState]]


class LoopCounter:
    """A labelled counter for the request path, updated on the event loop's thread only:
    a dict add, no lock (``prometheus_client`` takes a lock per ``inc``). Read at scrape
    as ``{name}_total``."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self.name, self.documentation, self.labels = name, documentation, labels
        self.values: dict[tuple[str, ...], float] = {}
        self._header = header(f"{name}_total", documentation, "counter").encode()
        self._kept: Kept[float] = Kept(self._line, float)

    def inc(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        values = self.values
        values[labels] = values.get(labels, 0.0) + amount

    def lines(self) -> list[bytes]:
        """The family in the text format, its header and a part per label set (each
        label set's line kept while unchanged)."""
        return [self._header, *self._kept.lines(self.values)]

    def _line(self, key: tuple[str, ...], value: float) -> str:
        return f"{self.name}_total{label_text(self.labels, key)} {number(value)}\n"

    def forget(self, first: str) -> None:
        """Drop the label sets whose first label is ``first`` (a function deleted)."""
        _forget(self.values, first)


class LoopHistogram:
    """A labelled histogram for the request path, updated on the event loop's thread
    only: a bisect and two adds, no lock (``prometheus_client`` scans its buckets in
    Python and takes two locks per ``observe``). Read at scrape with cumulative buckets."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: tuple[str, ...],
        buckets: tuple[float, ...],
    ) -> None:
        self.name, self.documentation, self.labels = name, documentation, labels
        self.bounds = tuple(float(b) for b in buckets)
        # per label values: a count per bucket (the last is +Inf), then the sum
        self.series: dict[tuple[str, ...], list[float]] = {}
        self._les = tuple(number(b) for b in (*self.bounds, float("inf")))  # "0.005", "+Inf"
        self._header = header(name, documentation, "histogram").encode()
        self._kept: Kept[list[float]] = Kept(self._lines, list.copy)

    def child(self, labels: tuple[str, ...]) -> list[float]:
        """The label values' counts (made on first use): hold it to observe into."""
        found = self.series.get(labels)
        if found is None:
            found = self.series[labels] = [0.0] * (len(self.bounds) + 2)
        return found

    def observe(self, child: list[float], amount: float) -> None:
        child[bisect_left(self.bounds, amount)] += 1  # le: the first bound >= amount
        child[-1] += amount

    def observe_each(self, child: list[float], amounts: Iterable[float]) -> None:
        """:meth:`observe` of each of ``amounts`` (a batch's queue waits: one call)."""
        bounds = self.bounds
        for amount in amounts:
            child[bisect_left(bounds, amount)] += 1
            child[-1] += amount

    def lines(self) -> list[bytes]:
        """The family in the text format, its header and a part per label set:
        cumulative ``le`` buckets, ``_count`` and ``_sum`` (each label set's lines
        kept while its counts are unchanged)."""
        return [self._header, *self._kept.lines(self.series)]

    def forget(self, first: str) -> None:
        """Drop the label sets whose first label is ``first`` (a function deleted)."""
        _forget(self.series, first)

    def _lines(self, key: tuple[str, ...], child: list[float]) -> str:
        before, after = bucket_labels(self.labels, key)
        bucket = f"{self.name}_bucket{before}"
        cumulative, lines = 0.0, []
        for le, count in zip(self._les, child[:-1], strict=True):
            cumulative += count
            lines.append(f"{bucket}{le}{after} {number(cumulative)}\n")
        plain = label_text(self.labels, key)
        lines.append(f"{self.name}_count{plain} {number(cumulative)}\n")
        lines.append(f"{self.name}_sum{plain} {number(child[-1])}\n")
        return "".join(lines)


def _forget(series: dict[tuple[str, ...], Any], first: str) -> None:
    for key in [key for key in series if key[0] == first]:
        del series[key]


class StateGauge:
    """A labelled gauge whose values are read afresh at each scrape (a state of the
    node's, not a count): :meth:`lines` of the values read."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self.name, self.documentation, self.labels = name, documentation, labels
        self._header = header(name, documentation, "gauge").encode()
        self._kept: Kept[float] = Kept(self._line, float)

    def lines(self, values: Mapping[tuple[str, ...], float]) -> list[bytes]:
        """The family in the text format, its header and a part per label set (each
        label set's line kept while its value is the same)."""
        return [self._header, *self._kept.lines(values)]

    def _line(self, key: tuple[str, ...], value: float) -> str:
        return f"{self.name}{label_text(self.labels, key)} {number(value)}\n"


class _States:
    """The gauges of every version held here (warm instances, queue depth, batches
    running, sequences stepping), read from ``source`` at each scrape."""

    def __init__(self, source: StateSource) -> None:
        self._source = source
        self._gauges = (
            StateGauge("fnrt_warm_instances", "Loaded instances", ("function", "version")),
            StateGauge(
                "fnrt_queue_depth", "Requests waiting in the queue", ("function", "version")
            ),
            StateGauge("fnrt_running_batches", "Batches running now", ("function", "version")),
            StateGauge(
                "fnrt_active_sequences",
                "Sequences of a generative function in a step batch now",
                ("function", "version"),
            ),
        )

    def families(self) -> Iterator[list[bytes]]:
        """Each gauge family: its header and a part per version."""
        warm: dict[tuple[str, ...], float] = {}
        depth: dict[tuple[str, ...], float] = {}
        running: dict[tuple[str, ...], float] = {}
        active: dict[tuple[str, ...], float] = {}
        for state in self._source():  # a split version's tails share its key: summed
            key = (state.function, state.version)
            warm[key] = warm.get(key, 0) + state.warm_instances
            depth[key] = depth.get(key, 0) + state.queued
            running[key] = running.get(key, 0) + state.running
            if state.active_sequences:
                active[key] = active.get(key, 0) + state.active_sequences
        for gauge, values in zip(self._gauges, (warm, depth, running, active), strict=True):
            yield gauge.lines(values)


class _StoreCollector:
    def __init__(
        self, requests: Callable[[], Mapping[str, int]], refused: Callable[[], int] | None
    ) -> None:
        self._requests = requests
        self._refused = refused

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "fnrt_store_requests", "Requests sent to the object store", labels=["operation"]
        )
        for operation, count in sorted(self._requests().items()):
            family.add_metric([operation], count)
        yield family
        if self._refused is not None:
            yield CounterMetricFamily(
                "fnrt_store_reads_refused",
                "Requests refused unread (429): too many names the store did not list, or "
                "version ids not held here, were waiting for a store read",
                value=self._refused(),
            )


class _JobCollector:
    def __init__(self, queued: Callable[[], Mapping[str, int]], running: Callable[[], int]) -> None:
        self._queued = queued
        self._running = running

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "fnrt_job_queued_records",
            "Records of asynchronous jobs not yet done, by function (the whole fleet's, as "
            "this node last read the store's queue): what KEDA scales nodes on",
            labels=["function"],
        )
        for function, count in sorted(self._queued().items()):
            family.add_metric([function], count)
        yield family
        yield GaugeMetricFamily(
            "fnrt_job_chunks_running", "Job chunks this node is running", value=self._running()
        )


class _SpareCollector:
    def __init__(self, ready: Callable[[], int], taken: Callable[[], int]) -> None:
        self._ready = ready
        self._taken = taken

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "fnrt_spare_workers",
            "Worker processes started ahead of cold starts, waiting (process isolation)",
            value=self._ready(),
        )
        yield CounterMetricFamily(
            "fnrt_spare_workers_taken",
            "Cold starts that took a spare worker instead of starting one",
            value=self._taken(),
        )


class _GpuCollector:
    """GPU utilisation and memory through NVML, when a GPU and its library are there."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._count = pynvml.nvmlDeviceGetCount()

    def collect(self) -> Iterator[Metric]:
        nvml = self._nvml
        util = GaugeMetricFamily("fnrt_gpu_utilization_ratio", "GPU busy fraction", labels=["gpu"])
        used = GaugeMetricFamily("fnrt_gpu_memory_used_bytes", "GPU memory used", labels=["gpu"])
        total = GaugeMetricFamily("fnrt_gpu_memory_total_bytes", "GPU memory", labels=["gpu"])
        for i in range(self._count):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            util.add_metric([str(i)], rates.gpu / 100.0)
            used.add_metric([str(i)], memory.used)
            total.add_metric([str(i)], memory.total)
        yield util
        yield used
        yield total


#: (function, version, device, instances there) of each loaded version.
DeviceSource = Callable[[], Iterable[tuple[str, str, str, int]]]


class _DeviceCollector:
    def __init__(self, source: DeviceSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        on = GaugeMetricFamily(
            "fnrt_instances_on_device",
            "Loaded instances by the device they run on (cpu, cuda:0, ...)",
            labels=["function", "version", "device"],
        )
        for function, version, device, count in self._source():
            on.add_metric([function, version, device], count)
        yield on


def _gpu_collector() -> _GpuCollector | None:
    try:
        collector = _GpuCollector()
    except Exception:  # no NVML library, no driver, or no GPU: nothing to report
        return None
    return collector if collector._count else None


class Metrics:
    """The server's metrics; :meth:`exposition` is the ``/metrics`` body."""

    def __init__(self, *, gpu: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # Updated per request or per batch, on the event loop's thread: lock-free series.
        self.requests = LoopCounter(
            "fnrt_requests",
            "Requests answered, by function, version and HTTP status",
            ("function", "version", "status"),
        )
        self.request_seconds = LoopHistogram(
            "fnrt_request_duration_seconds",
            "Time from request to response",
            ("function",),
            LATENCY_BUCKETS_S,
        )
        self.queue_seconds = LoopHistogram(
            "fnrt_queue_wait_seconds",
            "Time a request waited for its batch to start",
            ("function",),
            LATENCY_BUCKETS_S,
        )
        self.compute_seconds = LoopHistogram(
            "fnrt_batch_compute_duration_seconds",
            "Time a batch took on its instance",
            ("function",),
            LATENCY_BUCKETS_S,
        )
        self.batch_size = LoopHistogram(
            "fnrt_batch_size", "Requests per batch", ("function",), BATCH_BUCKETS
        )
        # Generative functions (docs/generation.md), per step or per sequence.
        self.time_to_first_token = LoopHistogram(
            "fnrt_time_to_first_token_seconds",
            "Time from a generate request's arrival to its first chunk",
            ("function",),
            LATENCY_BUCKETS_S,
        )
        self.time_per_output_token = LoopHistogram(
            "fnrt_time_per_output_token_seconds",
            "Time per chunk after the first, per sequence",
            ("function",),
            TOKEN_BUCKETS_S,
        )
        self.step_size = LoopHistogram(
            "fnrt_step_size", "Sequences per step of a generative function", ("function",),
            BATCH_BUCKETS,
        )  # fmt: skip
        self.step_seconds = LoopHistogram(
            "fnrt_step_duration_seconds",
            "Time one step of a generative function took on its instance",
            ("function",),
            TOKEN_BUCKETS_S,
        )
        self.tokens = LoopCounter(
            "fnrt_generated_tokens",
            "Chunks (tokens) generated; its rate is tokens per second",
            ("function",),
        )
        self.sequences = LoopCounter(
            "fnrt_sequences",
            "Generate requests ended, by reason: stop, length, deadline, cancelled",
            ("function", "reason"),
        )
        self.cold_starts = LoopCounter(
            "fnrt_cold_starts",
            "Instance loads, by the tier the model came from (l2 disk, l3 store)",
            ("function", "tier"),
        )
        self.load_seconds = LoopHistogram(
            "fnrt_load_duration_seconds",
            "Time to load an instance",
            ("function", "tier"),
            LATENCY_BUCKETS_S,
        )
        self.load_stage_seconds = Histogram(
            "fnrt_load_stage_duration_seconds",
            "Time in each stage of a cold start (environment, files, worker, import, "
            "load, setup, after, first_batch; fetch and verify are parts of files)",
            ["stage"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.tier_hits = Counter(
            "fnrt_cache_hits",
            "Loads answered by each tier: l1 (a loaded instance), l2 (disk), l3 (store)",
            ["tier"],
            registry=r,
        )
        self.tier_bytes = Counter(
            "fnrt_cache_read_bytes",
            "Model bytes loaded from each tier",
            ["tier"],
            registry=r,
        )
        self.starts = LoopCounter(
            "fnrt_invocation_starts",
            "Calls by what they found: warm, prewarmed (loaded ahead for them) or cold",
            ("function", "kind"),
        )
        self.prewarms = LoopCounter(
            "fnrt_prewarms",
            "Pre-warms by outcome: hit (used before unloaded) or miss",
            ("function", "outcome"),
        )
        self.evictions = Counter(
            "fnrt_evictions",
            "Instances unloaded, by reason: budget (memory for a load, the least worth "
            "first), plan (early, to be pre-warmed again) or idle (keep-alive over)",
            ["reason"],
            registry=r,
        )
        self.instance_restarts = LoopCounter(
            "fnrt_instance_restarts",
            "Instances replaced after they died or were killed, by cause "
            "(signal, exit, memory, timeout)",
            ("function", "cause"),
        )
        ProcessCollector(registry=r)  # process_resident_memory_bytes, cpu, fds
        # the series kept per function, written at scrape by fnrt (exposition.py)
        self._per_function: tuple[LoopCounter | LoopHistogram, ...] = (
            self.requests,
            self.request_seconds,
            self.queue_seconds,
            self.compute_seconds,
            self.batch_size,
            self.starts,
            self.time_to_first_token,
            self.time_per_output_token,
            self.step_size,
            self.step_seconds,
            self.tokens,
            self.sequences,
            self.cold_starts,
            self.load_seconds,
            self.prewarms,
            self.instance_restarts,
        )
        assert all(s.labels[0] == "function" for s in self._per_function)  # forget()
        self._states: _States | None = None
        self._l1_hits = self.tier_hits.labels("l1")
        gpu_collector = _gpu_collector() if gpu else None
        if gpu_collector is not None:
            r.register(gpu_collector)

    def watch(self, state: StateSource) -> None:
        """Report ``state()`` (warm instances, queue depth) at every scrape."""
        self._states = _States(state)

    def watch_devices(self, source: DeviceSource) -> None:
        """Report each loaded version's instances by device at every scrape."""
        self.registry.register(_DeviceCollector(source))

    def watch_store(
        self, requests: Callable[[], Mapping[str, int]], refused: Callable[[], int] | None = None
    ) -> None:
        """Report the store's request counts by operation at every scrape, and the
        requests refused a read of it (``Lookups.refused``)."""
        self.registry.register(_StoreCollector(requests, refused))

    def watch_jobs(
        self, queued: Callable[[], Mapping[str, int]], running: Callable[[], int]
    ) -> None:
        """Report job records waiting (by function) and chunks running here at every scrape."""
        self.registry.register(_JobCollector(queued, running))

    def watch_spares(self, ready: Callable[[], int], taken: Callable[[], int]) -> None:
        """Report the spare workers waiting, and those cold starts took, at every scrape."""
        self.registry.register(_SpareCollector(ready, taken))

    def request(self, function: str, version: str, status: int, seconds: float) -> None:
        self.requests.inc((function, version, str(status)))
        histogram = self.request_seconds
        histogram.observe(histogram.child((function,)), seconds)

    def start(self, function: str, kind: str) -> None:
        """A call found its function warm, pre-warmed or cold."""
        self.starts.inc((function, kind))

    def prewarm(self, function: str, outcome: str) -> None:
        self.prewarms.inc((function, outcome))

    def restart(self, function: str, cause: str) -> None:
        self.instance_restarts.inc((function, cause))

    def forget(self, function: str) -> None:
        """``function`` was deleted: its series go (Prometheus marks them stale), and
        what the scrape kept of them with them. Its versions' state gauges go as the
        node stops holding them."""
        for series in self._per_function:
            series.forget(function)

    def batch(self, function: str, size: int, compute_s: float, waits_s: Iterable[float]) -> None:
        key = (function,)
        self.batch_size.observe(self.batch_size.child(key), size)
        self.compute_seconds.observe(self.compute_seconds.child(key), compute_s)
        queue = self.queue_seconds
        queue.observe_each(queue.child(key), waits_s)

    def step(self, function: str, size: int, seconds: float, tokens: int) -> None:
        """One step of a generative function over ``size`` sequences, making ``tokens``
        chunks."""
        key = (function,)
        self.step_size.observe(self.step_size.child(key), size)
        self.step_seconds.observe(self.step_seconds.child(key), seconds)
        if tokens:
            self.tokens.inc(key, tokens)

    def sequence(
        self, function: str, reason: str, first_token_s: float | None, per_token_s: float | None
    ) -> None:
        """A generate request ended (``reason``)."""
        key = (function,)
        self.sequences.inc((function, reason))
        if first_token_s is not None:
            self.time_to_first_token.observe(self.time_to_first_token.child(key), first_token_s)
        if per_token_s is not None:
            histogram = self.time_per_output_token
            histogram.observe(histogram.child(key), per_token_s)

    def load(self, function: str, tier: str, size_bytes: int, seconds: float) -> None:
        key = (function, tier)
        self.cold_starts.inc(key)
        self.load_seconds.observe(self.load_seconds.child(key), seconds)
        self.tier_hits.labels(tier).inc()
        self.tier_bytes.labels(tier).inc(size_bytes)

    def warm_hits(self, count: int) -> None:
        """Requests served by an instance that was already loaded (the L1 tier)."""
        if count:
            self._l1_hits.inc(count)

    def families(self) -> Iterator[list[bytes]]:
        """The ``/metrics`` body a family at a time, each in parts: first
        ``prometheus_client``'s few series (process, store, tiers, evictions, load
        stages, GPUs), then those fnrt writes itself (a part per label set). Each is
        made when the iterator reaches it: the route lets the loop serve between them."""
        yield [generate_latest(self.registry)]
        for series in self._per_function:
            yield series.lines()
        if self._states is not None:
            yield from self._states.families()

    def exposition(self) -> bytes:
        """The ``/metrics`` body at once."""
        return b"".join(chain.from_iterable(self.families()))
