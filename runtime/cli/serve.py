"""``fnrt serve``: run the server.

Each option is a :class:`~fnrt.runtime.settings.ServerSettings` field, declared
once below with the ``FNRT_*`` variable it also reads; tracing follows the
standard ``OTEL_*`` variables, which the flags override.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from fnrt.loader.device import DeviceRefused, choose_devices, describe_choice, parse_device
from fnrt.runtime.cli.options import (
    DURATION,
    LOG_LEVEL,
    SIZE,
    flag,
    host_option,
    port_option,
    setting,
)
from fnrt.runtime.settings import (
    ServerSettings,
    default_cache_dir,
    env_trace_settings,
    read_token_file,
    split_origins,
)
from fnrt.tracing.setup import TraceConfig

#: ``fnrt serve``'s exit status when the server never started (the port taken, say),
#: as uvicorn's own.
STARTUP_FAILURE = 3
#: ``fnrt serve``'s exit status for settings it refuses to run with.
USAGE_ERROR = 2

#: Options that are not a ServerSettings field of the same name.
_NOT_FIELDS = {"admin_token_file", "cors_origins", "insecure_open_admin", "worker_imports"}
_TRACE_FLAGS = {
    "trace": "exporter",
    "trace_endpoint": "endpoint",
    "trace_protocol": "protocol",
    "trace_sample": "sampler_ratio",
}


def server_settings(options: Mapping[str, Any]) -> ServerSettings:
    """``fnrt serve``'s settings from its options (each already a flag, its variable or
    unset) and the ``OTEL_*`` variables; ValueError names the setting it refuses."""
    found = {
        key: value
        for key, value in options.items()
        if value is not None and key not in _NOT_FIELDS and key not in _TRACE_FLAGS
    }
    if options.get("admin_token_file") is not None:
        if options.get("admin_token") is not None:
            raise ValueError("admin_token and admin_token_file: give one, not both")
        found["admin_token"] = read_token_file(options["admin_token_file"])
    if options.get("cors_origins") is not None:
        found["cors_origins"] = split_origins(options["cors_origins"])
    if options.get("worker_imports") is not None:
        names = options["worker_imports"].split(",")
        found["worker_imports"] = tuple(n.strip() for n in names if n.strip())
    trace = env_trace_settings()
    for option, key in _TRACE_FLAGS.items():
        if options.get(option) is not None:
            trace[key] = options[option]
    if options.get("trace_sample") is not None and "sampler" not in trace:
        trace["sampler"] = "parentbased_traceidratio"
    found["trace"] = TraceConfig(**trace)  # type: ignore[arg-type]
    return ServerSettings(**found)


@click.command(
    "serve",
    short_help="run the server",
    epilog="Sizes take units (2GiB, 512MB, or bytes) and durations too (250ms, 5m, 7d, or "
    "seconds), as flags and as variables. Tracing also follows the standard OTEL_* "
    "variables (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_SAMPLER, "
    "OTEL_TRACES_SAMPLER_ARG); the --trace flags override them.",
)
@host_option
@port_option
@setting("store", help="object store: a folder, file://PATH or s3://bucket/prefix")
@setting("s3_endpoint", help="S3-compatible endpoint URL, e.g. MinIO")
@setting(
    "store_connect_timeout_s", type=DURATION, help="an S3 store's TCP connect must open within it"
)
@setting(
    "store_read_timeout_s",
    type=DURATION,
    help="the longest an S3 store may stay silent while an answer is awaited or arrives",
)
@setting(
    "store_deadline_s",
    type=DURATION,
    help="one S3 store operation, retries included (a download: the longest without a "
    "byte); past it the operation fails naming the store (a cold start: 503)",
)
@setting("store_download_deadline_s", type=DURATION, help="one whole download from an S3 store")
@setting(
    "scrub_interval_s",
    type=DURATION,
    help="how often the weight files loaded instances map are checked for changes (a stat)",
)
@setting(
    "scrub_rate_bytes_s",
    type=SIZE,
    help="how fast mapped weight files are read again through xxh3, per second (0: never)",
)
@setting("disk_cache_bytes", type=SIZE, help="L2 disk cache budget")
@setting(
    "memory_budget_bytes",
    type=SIZE,
    default_text="60% of RAM",
    help="memory for loaded instances; beyond it the idle ones worth least by their "
    "keep-alive plans are evicted",
)
@setting(
    "gpu_memory_budget_bytes",
    type=SIZE,
    default_text="90% of each GPU's",
    help="each GPU's memory for loaded instances (their tensors and their workers' CUDA "
    "contexts, measured); beyond it the idle ones worth least are evicted",
)
@setting(
    "gpu_concurrency",
    type=int,
    help="instances sharing each GPU, all functions together (0: no cap); "
    "fnrt bench-concurrency measures the best",
)
@setting(
    "cache_dir",
    type=click.Path(path_type=Path),
    default_text=str(default_cache_dir()),
    help="local cache folder: the L2 cache, unpacked code, environments",
)
@setting(
    "admin_token",
    help="require this bearer token on admin routes (visible in ps: prefer --admin-token-file)",
)
@setting(
    "admin_token_file",
    type=click.Path(path_type=Path),
    help="read the admin token from this file's first line",
)
@flag(
    "insecure_open_admin",
    help="serve a non-loopback address with no admin token (anyone who reaches it can "
    "deploy code); without it, fnrt serve refuses to start so",
)
@setting(
    "invoke_keys_file",
    type=click.Path(path_type=Path),
    help='JSON {"function" or "*": ["key", ...]}: those functions answer only '
    "'Authorization: Bearer <key>'",
)
@setting("cors_origins", help="browser origins allowed to call, comma-separated, or '*'")
@setting(
    "ssl_certfile", type=click.Path(path_type=Path), help="serve HTTPS with this certificate (PEM)"
)
@setting("ssl_keyfile", type=click.Path(path_type=Path), help="the certificate's private key (PEM)")
@setting("max_queued", type=int, help="requests queued across all functions before 429")
@setting("max_body_bytes", type=SIZE, help="largest invoke body, else 413")
@setting(
    "max_json_body_bytes",
    type=SIZE,
    help="largest JSON body, else 413 pointing to msgpack: JSON is parsed holding the event loop",
)
@setting(
    "max_tensor_elements",
    type=int,
    help="elements a tensor's shape may declare, a 0 dimension counting as 1, else 413",
)
@setting(
    "max_response_bytes", type=SIZE, help="largest response, estimated before encoding, else 413"
)
@setting(
    "header_timeout_s",
    type=DURATION,
    help="a connection with no request in progress this long (a head still arriving, or "
    "none sent since the connection or the last answer) gets 408 and is closed",
)
@setting(
    "body_timeout_s",
    type=DURATION,
    help="the longest pause between reads of a request body, else the connection is closed",
)
@setting(
    "min_body_rate_bytes_s",
    type=click.FloatRange(min=0),
    help="a request body must arrive at this many bytes/s or more over each "
    "--body-rate-window-s spent waiting on the client, else 408 and the connection is "
    "closed (a body trickled a byte a second never stalls); an answer the client does not "
    "take as fast is cut off; 0: no minimum",
)
@setting(
    "body_rate_window_s",
    type=DURATION,
    help="the window over which --min-body-rate-bytes-s is judged",
)
@setting(
    "max_connections",
    "--max-connections",
    "--limit-concurrency",
    type=int,
    default_text="the descriptor limit less --fd-reserve",
    help="open connections at most; at the cap a new one closes the worst offender (the "
    "slowest body or answer under --min-body-rate-bytes-s, else the longest without a "
    "request, and only then the longest kept alive between requests), or gets 503 when all "
    "have a request in progress at a good pace",
)
@setting(
    "drain_delay_s",
    type=DURATION,
    help="after SIGTERM, /readyz answers 503 at once but the node goes on accepting and "
    "serving this long, so load balancers drop it first: 2 behind nginx, and 2 after a "
    "5 s preStop on Kubernetes (docs/fleet.md)",
)
@setting(
    "watch_interval_s",
    type=DURATION,
    help="how often the store's change feed is polled for deploys, traffic changes and "
    "deletes made through other nodes: one request per poll, whatever the number of "
    "functions",
)
@setting(
    "shutdown_timeout_s",
    type=DURATION,
    help="after SIGTERM and the drain delay, how long work in flight may finish; then "
    "what is still queued or running answers 503 and the server exits, whatever handlers do",
)
@setting(
    "cold_start_price_mean_s",
    type=click.FloatRange(min=0),
    help="what a cold start is worth to the auto keep-alive, in seconds of the node's mean "
    "instance kept loaded (the same on any workload, whatever its functions' sizes): "
    "higher keeps functions loaded longer and pre-warms wider (fewer cold starts, more "
    "memory); a manifest's [scaling] cold_start_price_gb_s or cold_start_price_s overrides it",
)
@setting(
    "fill_memory",
    "--fill-memory/--no-fill-memory",
    default=None,
    default_text="with --memory-budget-bytes, each plan while what a fixed 10-minute "
    "keep-alive would hold fits the budget; else never",
    help="keep idle instances past their keep-alive plans while the memory budget has "
    "room, evicting the least worth when a load needs it (a pre-warm may evict those "
    "worth less than it): the budget is a cache of warm functions, filled; auto plans "
    "those at 4x the price of a cold start (idle memory within the budget costs "
    "nothing). By default, on a node given --memory-budget-bytes, a plan made after a "
    "call fills it when what a fixed 10-minute keep-alive would hold then fits the "
    "budget, and is made at the plain price when it does not (docs/prewarm.md)",
)
@setting(
    "cold_start_price_gb_s",
    type=click.FloatRange(min=0),
    default_text="none: --cold-start-price-mean-s",
    help="or: what a cold start is worth to the auto keep-alive, in GB·s of idle memory "
    "(an absolute price, whatever the node's functions' sizes)",
)
@setting(
    "fd_reserve",
    type=int,
    help="file descriptors kept from connections for the store, the cache and worker processes",
)
@setting(
    "redis_url",
    default_text="none: such functions cache in memory",
    help='the Redis that functions with [result_cache] backend = "redis" share with every '
    "node, e.g. redis://cache:6379/0; while it is down, calls are served uncached",
)
@setting(
    "isolation",
    type=click.Choice(["process", "thread"]),
    help="where a function's instances run unless its manifest's [isolation] mode says: a "
    "worker process each (a crash, a hang or a leak stays there), or a thread of the server",
)
@setting(
    "spare_workers",
    type=int,
    help="worker processes kept started ahead, their imports done, for the next cold start "
    "in process isolation, and as many for each of the two [environment]s used last "
    "(0: each cold start starts its own)",
)
@setting(
    "worker_imports",
    help="modules a spare worker imports ahead, comma-separated (e.g. torch,onnxruntime), "
    "beside those the functions' code imports and loads here were seen to import; given, a "
    "spare starts with the server",
)
@setting(
    "device",
    type=str,
    metavar="auto|cpu|cuda|cuda:N,...",
    help="where instances run: cuda uses every visible GPU (each instance on the one with "
    "the most free budget), cuda:1,cuda:3 those; auto is every GPU when fnrt[gpu] is "
    "installed and one is visible, else the CPU. cuda on a machine without either is refused",
)
@flag(
    "jobs",
    "--jobs/--no-jobs",
    help="take chunks of asynchronous jobs (fnrt job) from the store's queue, at the lowest "
    "priority; --no-jobs: this node still takes submits but runs none",
)
@setting("job_poll_interval_s", type=DURATION, help="how often the store's job queue is read")
@setting(
    "job_lease_s",
    type=DURATION,
    help="how long a node holds a job chunk without renewing it: a killed node's chunks "
    "are taken again by others after this",
)
@setting(
    "job_retention_s",
    type=DURATION,
    help="how long an ended job's records and results stay in the store (0: for good, else "
    "at least 1h); its folder is then removed, as is a submit's that a node left unqueued "
    "a day ago",
)
@setting("job_chunks", type=int, help="job chunks this node runs at once")
@setting("max_job_bytes", type=SIZE, help="largest record file a job submit takes, else 413")
@flag("preload", help="load every function at start instead of at first invoke")
@setting("log_level", type=LOG_LEVEL, help="log level")
@flag("log_json", help="log JSON lines")
@flag("request_log", "--request-log/--no-request-log", help="a JSON line per request")
@setting(
    "request_log_file",
    type=click.Path(path_type=Path),
    metavar="PATH",
    help="append the request log (a JSON line per request) to PATH instead of stderr",
)
@click.option(
    "--trace",
    type=click.Choice(["none", "console", "otlp"]),
    help="export spans (OTEL_TRACES_EXPORTER; default none)",
)
@click.option(
    "--trace-endpoint",
    help="OTLP collector, e.g. http://127.0.0.1:4318 (OTEL_EXPORTER_OTLP_ENDPOINT)",
)
@click.option(
    "--trace-protocol",
    type=click.Choice(["http/protobuf"]),
    help="OTLP protocol: http/protobuf, the one fnrt speaks and every collector takes "
    "(OTEL_EXPORTER_OTLP_PROTOCOL)",
)
@click.option(
    "--trace-sample",
    type=click.FloatRange(0.0, 1.0),
    metavar="RATIO",
    help="keep this fraction of traces that start here, follow the caller's choice otherwise "
    "(OTEL_TRACES_SAMPLER=parentbased_traceidratio, OTEL_TRACES_SAMPLER_ARG)",
)
def serve(**options: Any) -> int:
    """Run the fnrt server (Starlette on uvicorn with uvloop).

    Nothing is loaded until the first invoke, unless --preload or a manifest's
    load_at_start.
    """
    from fnrt.runtime.http.app import build_app, make_server
    from fnrt.tracing.logs import configure_logging

    try:
        settings = server_settings(options)
    except ValueError as exc:  # a setting refused (flag or variable): one line, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    configure_logging(settings.log_level, json_lines=settings.log_json)
    if settings.admin_open and not _is_loopback(settings.host):
        if not options["insecure_open_admin"]:
            print(
                f"error: refusing to serve {settings.host} without an admin token: anyone who "
                "reaches it could deploy code and run it here. Set --admin-token-file, "
                "FNRT_ADMIN_TOKEN_FILE or FNRT_ADMIN_TOKEN (or, on a network you trust, "
                "pass --insecure-open-admin)",
                file=sys.stderr,
            )
            return USAGE_ERROR
        print(
            f"WARNING: admin routes (deploy: running code) are open to anyone who reaches "
            f"{settings.host} (--insecure-open-admin)",
            file=sys.stderr,
        )
    try:  # before anything starts: a busy port is the first thing said, and the last
        sock = listening_socket(settings.host, settings.port)
    except OSError as exc:
        print(
            f"error: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return STARTUP_FAILURE
    try:  # a GPU asked for and not there: one line naming the extra or the cause
        devices = choose_devices(settings.device)
    except DeviceRefused as exc:
        sock.close()
        print(f"error: {exc.message}", file=sys.stderr)
        return STARTUP_FAILURE
    app = build_app(settings)
    port = sock.getsockname()[1]
    print(
        f"fnrt: serving store {settings.store} on http://{settings.host}:{port}; "
        f"instances on {describe_choice(parse_device(settings.device), devices)}",
        file=sys.stderr,
    )
    server = make_server(app, settings)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl-C it stopped on
        server.run(sockets=[sock])
    code = 0 if server.started else STARTUP_FAILURE
    exit_past_stuck_threads(code)
    return code


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (uvicorn listens on it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def exit_past_stuck_threads(code: int) -> None:
    """Exit now if a handler's thread is stuck (abandoned at shutdown): Python would
    otherwise wait for it at exit, for ever. Logs and telemetry are flushed by then."""
    stuck = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and t.is_alive() and not t.daemon
    ]
    if stuck:
        print(f"fnrt: exiting past threads still running: {', '.join(stuck)}", file=sys.stderr)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
