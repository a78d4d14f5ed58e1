"""Configuration of the server and the CLI.

Every setting has a flag and an ``FNRT_*`` variable, declared once with its
option in ``fnrt.runtime.cli`` (click reads the variable); a flag wins over the
variable, which wins over the default declared here. Tracing follows the
standard ``OTEL_*`` variables (:func:`env_trace_settings`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from fnrt.functions.limits import TensorLimits
from fnrt.loader.device import parse_device
from fnrt.loader.stores.s3 import S3Config
from fnrt.tracing.setup import TraceConfig, trace_config_from_env

T = TypeVar("T")

DEFAULT_STORE = "./.fnrt/store"
DEFAULT_SERVER = "http://127.0.0.1:8000"  # fnrt.client.DEFAULT_URL (decisions import no client)


def default_cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fnrt"


#: The settings that set :class:`TensorLimits`' fields of other names.
LIMIT_SETTINGS = {"max_elements": "max_tensor_elements"}


@dataclass(frozen=True)
class ServerSettings:
    """``fnrt serve`` settings."""

    host: str = "127.0.0.1"
    port: int = 8000
    store: str = DEFAULT_STORE
    cache_dir: Path = field(default_factory=default_cache_dir)
    disk_cache_bytes: int = 20 * 1024**3
    memory_budget_bytes: int | None = None  # None: 60% of physical memory
    gpu_memory_budget_bytes: int | None = None  # None: 90% of the GPU's memory (on a GPU)
    gpu_concurrency: int = 0  # instances sharing the GPU, all functions together (0: no cap)
    s3_endpoint: str | None = None
    s3_region: str | None = None
    s3_part_size_bytes: int = 16 * 1024 * 1024
    s3_concurrency: int = 8
    #: bounds on waiting for an S3 store (docs/hardening.md): a connect, a silence
    #: while an answer is awaited, one operation with its retries (a download: without a
    #: byte arriving), a whole download
    store_connect_timeout_s: float = 2.0
    store_read_timeout_s: float = 5.0
    store_deadline_s: float = 15.0
    store_download_deadline_s: float = 1800.0
    #: the mapped weight files' check (loader/scrub.py): how often each is stat'ed, and
    #: how fast they are read again through xxh3 (0: no re-reading)
    scrub_interval_s: float = 10.0
    scrub_rate_bytes_s: int = 64 * 1024 * 1024
    admin_token: str | None = None
    invoke_keys_file: Path | None = None  # JSON: {"function" or "*": [keys]}
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call ("*": any)
    ssl_certfile: Path | None = None  # TLS: both, or neither
    ssl_keyfile: Path | None = None
    max_body_bytes: int = 64 * 1024 * 1024
    #: JSON is parsed holding the GIL (3 s for 59 MB): big tensors go as msgpack.
    #: The smaller of this and max_body_bytes applies.
    max_json_body_bytes: int = 8 * 1024 * 1024
    max_tensor_elements: int = 64 * 1024 * 1024  # cells per tensor, a 0 dimension counting 1
    max_response_bytes: int = 64 * 1024 * 1024  # estimated before encoding, else 413
    max_queued: int = 10_000
    header_timeout_s: float = 10.0  # a request head must arrive within it (slowloris), else 408
    body_timeout_s: float = 30.0  # the longest pause between reads of a body
    #: a body must arrive at this many bytes/s, over each window of body_rate_window_s
    #: spent waiting on the client, else 408 (0: no minimum); answers must leave as fast
    min_body_rate_bytes_s: float = 500.0
    body_rate_window_s: float = 10.0
    max_connections: int | None = None  # None: the descriptor limit less fd_reserve
    fd_reserve: int = 256  # descriptors kept for the store, the cache and workers
    drain_delay_s: float = 0.0  # after SIGTERM, /readyz 503 but still accepting this long
    shutdown_timeout_s: float = 30.0  # then, work still running past it answers 503
    sweep_interval_s: float = 1.0
    #: what a cold start is worth to the ``auto`` keep-alive: seconds of the node's mean
    #: instance kept loaded (the same on every workload), or GB·s of idle memory when set
    cold_start_price_mean_s: float = 4000.0
    cold_start_price_gb_s: float | None = None
    #: keep idle instances past their plans while the memory budget has room: always,
    #: never, or None (the default): with a budget given, each plan while what a fixed
    #: keep-alive would hold fits it (``fills_memory``)
    fill_memory: bool | None = None
    watch_interval_s: float = 1.0  # how often routing changed by other nodes is read
    redis_url: str | None = None  # the shared result cache (redis://host:6379/0)
    jobs: bool = True  # take chunks of asynchronous jobs (runtime/jobs/)
    job_poll_interval_s: float = 1.0  # how often the store's job queue is read
    job_lease_s: float = 30.0  # a chunk's hold: a killed node's chunks are taken again after it
    job_retention_s: float = 7 * 86_400.0  # an ended job's records and results kept (0: for good)
    job_chunks: int = 2  # chunks one node runs at once
    max_job_bytes: int = 1024 * 1024 * 1024  # largest record file a job submit takes, else 413
    preload: bool = False
    isolation: str = "process"  # where instances run unless a manifest says: process, thread
    spare_workers: int = 1  # worker processes started ahead of cold starts (process isolation)
    worker_imports: tuple[str, ...] = ()  # modules spare workers import ahead (and learned ones)
    device: str = "auto"  # auto, cpu, cuda (every visible GPU) or cuda:1,cuda:3
    log_level: str = "info"
    log_json: bool = False
    request_log: bool = True  # one JSON line per request (fnrt.access, info)
    request_log_file: Path | None = None  # appended to, instead of stderr
    trace: TraceConfig = field(default_factory=TraceConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port} is not a TCP port")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes: must be at least 1024")
        if self.sweep_interval_s <= 0:
            raise ValueError("sweep_interval_s: must be > 0")
        if self.watch_interval_s <= 0:
            raise ValueError("watch_interval_s: must be > 0")
        if not self.cold_start_price_mean_s >= 0:
            raise ValueError("cold_start_price_mean_s: must be a number >= 0")
        if self.cold_start_price_gb_s is not None and not self.cold_start_price_gb_s >= 0:
            raise ValueError("cold_start_price_gb_s: must be a number >= 0")
        if self.isolation not in ("process", "thread"):
            raise ValueError(f"isolation: {self.isolation!r} is not process or thread")
        if self.spare_workers < 0:
            raise ValueError("spare_workers: must be >= 0")
        for name in self.worker_imports:
            if not all(part.isidentifier() for part in name.split(".")):
                raise ValueError(f"worker_imports: {name!r} is not a module name")
        parse_device(self.device)  # ValueError naming device
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile: give both, or neither")
        if self.admin_token == "":
            raise ValueError("admin_token: must not be empty (leave it unset for no token)")
        if self.max_json_body_bytes < 1024:
            raise ValueError("max_json_body_bytes: must be at least 1024")
        try:
            TensorLimits(
                max_elements=self.max_tensor_elements, max_response_bytes=self.max_response_bytes
            )
        except ValueError as exc:  # named as the setting, not as TensorLimits' field
            field, _, why = str(exc).partition(": ")
            raise ValueError(f"{LIMIT_SETTINGS.get(field, field)}: {why}") from None
        if self.shutdown_timeout_s <= 0:
            raise ValueError("shutdown_timeout_s: must be > 0")
        if self.drain_delay_s < 0:
            raise ValueError("drain_delay_s: must be >= 0")
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("header_timeout_s, body_timeout_s: must be > 0")
        if not self.min_body_rate_bytes_s >= 0:
            raise ValueError("min_body_rate_bytes_s: must be >= 0 (0: no minimum)")
        if not self.body_rate_window_s > 0:
            raise ValueError("body_rate_window_s: must be > 0")
        try:
            self.s3_config()
        except ValueError as exc:  # S3Config names its field: name the setting
            found, _, why = str(exc).partition(":")
            prefix = "s3_" if found in ("part_size_bytes", "concurrency") else "store_"
            raise ValueError(f"{prefix}{found}:{why}") from None
        if not self.scrub_interval_s > 0:
            raise ValueError("scrub_interval_s: must be > 0")
        if self.scrub_rate_bytes_s < 0:
            raise ValueError("scrub_rate_bytes_s: must be >= 0 (0: no re-reading)")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("max_connections: must be at least 1")
        if self.fd_reserve < 0:
            raise ValueError("fd_reserve: must be >= 0")
        if self.job_poll_interval_s <= 0 or self.job_lease_s <= 0:
            raise ValueError("job_poll_interval_s, job_lease_s: must be > 0")
        if not (self.job_retention_s == 0 or self.job_retention_s >= 3600):
            raise ValueError("job_retention_s: 0 (ended jobs kept for good) or at least 1h")
        if self.job_chunks < 1:
            raise ValueError("job_chunks: must be at least 1")
        if self.max_job_bytes < 1024:
            raise ValueError("max_job_bytes: must be at least 1024")
        if self.max_queued < 1:
            raise ValueError("max_queued: must be at least 1")
        if self.disk_cache_bytes <= 0:
            raise ValueError("disk_cache_bytes: must be > 0")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes <= 0:
            raise ValueError("memory_budget_bytes: must be > 0")
        if self.gpu_memory_budget_bytes is not None and self.gpu_memory_budget_bytes <= 0:
            raise ValueError("gpu_memory_budget_bytes: must be > 0")
        if self.gpu_concurrency < 0:
            raise ValueError("gpu_concurrency: must be 0 (no cap) or more")

    @functools.cached_property
    def json_body_limit(self) -> int:
        return min(self.max_json_body_bytes, self.max_body_bytes)

    @functools.cached_property
    def tensor_limits(self) -> TensorLimits:
        return TensorLimits(
            max_elements=self.max_tensor_elements, max_response_bytes=self.max_response_bytes
        )

    @property
    def fills_memory(self) -> bool | None:
        """Whether idle instances stay past their plans while the budget has room: as
        ``fill_memory`` says; by default (None) each plan decides
        (:func:`fnrt.runtime.prewarm.policies.fills`) on a node given a memory budget,
        and none does under the default budget (a share of physical memory, a bound,
        not a cache to fill)."""
        if self.fill_memory is None and self.memory_budget_bytes is None:
            return False
        return self.fill_memory

    @property
    def memory_budget(self) -> int:
        """The L1 budget in bytes: as set, else 60% of this machine's memory."""
        if self.memory_budget_bytes is not None:
            return self.memory_budget_bytes
        return int(0.6 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    def gpu_memory_budget(self, total_bytes: int) -> int:
        """Each GPU's budget in bytes for a device of ``total_bytes``: as set, else 90% of
        it (the rest is the CUDA contexts', cuBLAS's and the staging buffers')."""
        if self.gpu_memory_budget_bytes is not None:
            return self.gpu_memory_budget_bytes
        return int(0.9 * total_bytes)

    def s3_config(self) -> S3Config:
        return replace(
            s3_config(
                self.s3_endpoint, self.s3_region, self.s3_part_size_bytes, self.s3_concurrency
            ),
            connect_timeout_s=self.store_connect_timeout_s,
            read_timeout_s=self.store_read_timeout_s,
            deadline_s=self.store_deadline_s,
            download_deadline_s=self.store_download_deadline_s,
        )

    @property
    def admin_open(self) -> bool:
        return self.admin_token is None


@dataclass(frozen=True)
class ClientSettings:
    """Where the CLI sends requests, and with which token."""

    server: str = DEFAULT_SERVER
    token: str | None = None
    timeout_s: float = 300.0


def read_token_file(path: Path) -> str:
    """A token kept in a file (so it is not in ``ps``): its first line, stripped."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"token file {path}: {exc}") from None
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


def split_origins(text: str) -> tuple[str, ...]:
    """``https://a.example, https://b.example`` as a tuple of origins."""
    return tuple(o.strip().rstrip("/") for o in text.split(",") if o.strip())


def env_trace_settings(env: Mapping[str, str] = os.environ) -> dict[str, object]:
    """:class:`TraceConfig` fields from the standard ``OTEL_*`` variables."""
    return trace_config_from_env(env)


def s3_config(
    endpoint: str | None,
    region: str | None = None,
    part_size_bytes: int = 16 * 1024 * 1024,
    concurrency: int = 8,
) -> S3Config:
    """S3 transfer settings; region and credentials otherwise come the standard AWS ways."""
    return S3Config(
        endpoint_url=endpoint,
        region=region,
        part_size_bytes=part_size_bytes,
        concurrency=concurrency,
    )
