"""Prometheus metrics for ``GET /metrics``, on a registry of the server's own.

The series updated per request or per batch are lock-free (:class:`LoopCounter`,
:class:`LoopHistogram`: a dict add, a bisect), since only the event loop's
thread updates them; the rest are ``prometheus_client``'s (a lock and an add
each); gauges that describe state (warm instances, queue depth, memory, GPU)
are read when ``/metrics`` is scraped, from a callback the runtime gives.
Names follow Prometheus conventions: ``fnrt_`` prefix, base units
(seconds, bytes), ``_total`` for counters.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector

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


@dataclass(frozen=True)
class FunctionState:
    """What a scrape reports of one loaded function version."""

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

    def inc(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        values = self.values
        values[labels] = values.get(labels, 0.0) + amount

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=list(self.labels))
        for labels, value in sorted(list(self.values.items())):  # list(): one step, atomic
            family.add_metric(list(labels), value)
        yield family


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

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=list(self.labels))
        for labels, child in sorted(list(self.series.items())):
            counts = child[:-1]
            cumulative, buckets = 0.0, []
            for bound, count in zip((*self.bounds, float("inf")), counts, strict=True):
                cumulative += count
                buckets.append((_le(bound), cumulative))
            family.add_metric(list(labels), buckets, child[-1])
        yield family


def _le(bound: float) -> str:
    """A bucket's ``le`` label as Prometheus writes it (``0.005``, ``1.0``, ``+Inf``)."""
    return "+Inf" if bound == float("inf") else repr(bound)


class _LoopCollector:
    """Exposes the loop-thread series at scrape."""

    def __init__(self, series: Iterable[LoopCounter | LoopHistogram]) -> None:
        self._series = tuple(series)

    def collect(self) -> Iterator[Metric]:
        for series in self._series:
            yield from series.collect()


class _StateCollector:
    def __init__(self, source: StateSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        warm = GaugeMetricFamily(
            "fnrt_warm_instances", "Loaded instances", labels=["function", "version"]
        )
        depth = GaugeMetricFamily(
            "fnrt_queue_depth", "Requests waiting in the queue", labels=["function", "version"]
        )
        running = GaugeMetricFamily(
            "fnrt_running_batches", "Batches running now", labels=["function", "version"]
        )
        active = GaugeMetricFamily(
            "fnrt_active_sequences",
            "Sequences of a generative function in a step batch now",
            labels=["function", "version"],
        )
        for state in self._source():
            labels = [state.function, state.version]
            warm.add_metric(labels, state.warm_instances)
            depth.add_metric(labels, state.queued)
            running.add_metric(labels, state.running)
            if state.active_sequences:
                active.add_metric(labels, state.active_sequences)
        yield warm
        yield depth
        yield running
        yield active


class _StoreCollector:
    def __init__(self, requests: Callable[[], Mapping[str, int]]) -> None:
        self._requests = requests

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "fnrt_store_requests", "Requests sent to the object store", labels=["operation"]
        )
        for operation, count in sorted(self._requests().items()):
            family.add_metric([operation], count)
        yield family


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
        self.cold_starts = Counter(
            "fnrt_cold_starts",
            "Instance loads, by the tier the model came from (l2 disk, l3 store)",
            ["function", "tier"],
            registry=r,
        )
        self.load_seconds = Histogram(
            "fnrt_load_duration_seconds",
            "Time to load an instance",
            ["function", "tier"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
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
        self.prewarms = Counter(
            "fnrt_prewarms",
            "Pre-warms by outcome: hit (used before unloaded) or miss",
            ["function", "outcome"],
            registry=r,
        )
        self.evictions = Counter(
            "fnrt_evictions",
            "Instances unloaded, by reason: budget (memory for a load, the least worth "
            "first), plan (early, to be pre-warmed again) or idle (keep-alive over)",
            ["reason"],
            registry=r,
        )
        self.instance_restarts = Counter(
            "fnrt_instance_restarts",
            "Instances replaced after they died or were killed, by cause "
            "(signal, exit, memory, timeout)",
            ["function", "cause"],
            registry=r,
        )
        ProcessCollector(registry=r)  # process_resident_memory_bytes, cpu, fds
        r.register(
            _LoopCollector(
                (
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
                )
            )
        )
        self._l1_hits = self.tier_hits.labels("l1")
        gpu_collector = _gpu_collector() if gpu else None
        if gpu_collector is not None:
            r.register(gpu_collector)

    def watch(self, state: StateSource) -> None:
        """Report ``state()`` (warm instances, queue depth) at every scrape."""
        self.registry.register(_StateCollector(state))

    def watch_devices(self, source: DeviceSource) -> None:
        """Report each loaded version's instances by device at every scrape."""
        self.registry.register(_DeviceCollector(source))

    def watch_store(self, requests: Callable[[], Mapping[str, int]]) -> None:
        """Report the store's request counts by operation at every scrape."""
        self.registry.register(_StoreCollector(requests))

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
        self.prewarms.labels(function, outcome).inc()

    def restart(self, function: str, cause: str) -> None:
        self.instance_restarts.labels(function, cause).inc()

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
        self.cold_starts.labels(function, tier).inc()
        self.load_seconds.labels(function, tier).observe(seconds)
        self.tier_hits.labels(tier).inc()
        self.tier_bytes.labels(tier).inc(size_bytes)

    def warm_hits(self, count: int) -> None:
        """Requests served by an instance that was already loaded (the L1 tier)."""
        if count:
            self._l1_hits.inc(count)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
