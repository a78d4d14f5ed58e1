"""Prometheus metrics for ``GET /metrics``, on a registry of the server's own.

Counters and histograms are updated on the request path (a lock and an add
each); gauges that describe state (warm instances, queue depth, memory, GPU)
are read when ``/metrics`` is scraped, from a callback the runtime gives.
Names follow Prometheus conventions: ``fnrt_`` prefix, base units
(seconds, bytes), ``_total`` for counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Request latencies from a cache hit (~100 µs) to a cold start from the store (~minutes).
LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class FunctionState:
    """What a scrape reports of one loaded function version."""

    function: str
    version: str
    warm_instances: int
    queued: int
    running: int = 0  # batches running now


StateSource = Callable[[], Iterable[FunctionState]]

M = TypeVar("M", Counter, Histogram)


class Labelled(Generic[M]):
    """A metric's children by label values, each looked up once.

    ``prometheus_client``'s ``labels()`` checks its arguments and takes a lock on
    every call (about 2 µs): three times per request on the hot path. Label
    sets here are bounded (functions, versions, statuses, kinds) and children
    are never removed, so each is kept.
    """

    def __init__(self, metric: M) -> None:
        self.metric: M = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


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
        for state in self._source():
            labels = [state.function, state.version]
            warm.add_metric(labels, state.warm_instances)
            depth.add_metric(labels, state.queued)
            running.add_metric(labels, state.running)
        yield warm
        yield depth
        yield running


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
        self.requests = Counter(
            "fnrt_requests",
            "Requests answered, by function, version and HTTP status",
            ["function", "version", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "fnrt_request_duration_seconds",
            "Time from request to response",
            ["function"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.queue_seconds = Histogram(
            "fnrt_queue_wait_seconds",
            "Time a request waited for its batch to start",
            ["function"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.compute_seconds = Histogram(
            "fnrt_batch_compute_duration_seconds",
            "Time a batch took on its instance",
            ["function"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.batch_size = Histogram(
            "fnrt_batch_size",
            "Requests per batch",
            ["function"],
            buckets=BATCH_BUCKETS,
            registry=r,
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
        self.starts = Counter(
            "fnrt_invocation_starts",
            "Calls by what they found: warm, prewarmed (loaded ahead for them) or cold",
            ["function", "kind"],
            registry=r,
        )
        self.prewarms = Counter(
            "fnrt_prewarms",
            "Pre-warms by outcome: hit (used before unloaded) or miss",
            ["function", "outcome"],
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
        # The children updated per request or per batch, looked up once each.
        self._requests = Labelled(self.requests)
        self._request_seconds = Labelled(self.request_seconds)
        self._starts = Labelled(self.starts)
        self._batch_size = Labelled(self.batch_size)
        self._compute_seconds = Labelled(self.compute_seconds)
        self._queue_seconds = Labelled(self.queue_seconds)
        self._l1_hits = self.tier_hits.labels("l1")
        gpu_collector = _gpu_collector() if gpu else None
        if gpu_collector is not None:
            r.register(gpu_collector)

    def watch(self, state: StateSource) -> None:
        """Report ``state()`` (warm instances, queue depth) at every scrape."""
        self.registry.register(_StateCollector(state))

    def watch_store(self, requests: Callable[[], Mapping[str, int]]) -> None:
        """Report the store's request counts by operation at every scrape."""
        self.registry.register(_StoreCollector(requests))

    def request(self, function: str, version: str, status: int, seconds: float) -> None:
        self._requests(function, version, str(status)).inc()
        self._request_seconds(function).observe(seconds)

    def start(self, function: str, kind: str) -> None:
        """A call found its function warm, pre-warmed or cold."""
        self._starts(function, kind).inc()

    def prewarm(self, function: str, outcome: str) -> None:
        self.prewarms.labels(function, outcome).inc()

    def restart(self, function: str, cause: str) -> None:
        self.instance_restarts.labels(function, cause).inc()

    def batch(self, function: str, size: int, compute_s: float, waits_s: Iterable[float]) -> None:
        self._batch_size(function).observe(size)
        self._compute_seconds(function).observe(compute_s)
        queue = self._queue_seconds(function)
        for wait in waits_s:
            queue.observe(wait)

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
