"""``fnrt``: serve functions, deploy them, invoke them, list and remove them.

Run ``fnrt COMMAND --help`` for each command's options. Every option that
names a server, store or token also reads an ``FNRT_*`` variable.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ipaddress
import json
import logging
import os
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from fnrt.client import Client, ServerError
from fnrt.functions.bundle import pack
from fnrt.functions.codec import Format, decode_json, decode_msgpack
from fnrt.functions.errors import FnrtError
from fnrt.functions.manifest import load_manifest
from fnrt.functions.version import VersionManifest
from fnrt.runtime.about import installed_version
from fnrt.runtime.cli import dev, edge, simulate, summary, versions
from fnrt.runtime.cli.upload import upload_bundle
from fnrt.runtime.settings import (
    DEFAULT_SERVER,
    ClientSettings,
    ServerSettings,
    default_cache_dir,
    env_client_settings,
    env_s3_endpoint,
    env_server_settings,
    env_trace_settings,
    read_token_file,
    s3_config,
    split_origins,
)
from fnrt.runtime.units import parse_bytes, parse_seconds
from fnrt.tracing.setup import TraceConfig

EPILOG = "Docs: README.md and docs/ in the fnrt repository."
#: ``fnrt serve``'s exit status when the server never started (the port taken, say),
#: as uvicorn's own.
STARTUP_FAILURE = 3
#: ``fnrt serve``'s exit status for settings it refuses to run with.
USAGE_ERROR = 2


def _size(text: str) -> int:
    """A ``--*-bytes`` value: ``2GiB``, ``512MB`` or a number of bytes."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> float:
    """A ``--*-s`` value: ``250ms``, ``5m`` or a number of seconds."""
    try:
        return parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _client(args: argparse.Namespace) -> Client:
    found = env_client_settings()
    if args.server:
        found["server"] = args.server
    if args.token:
        found["token"] = args.token
    settings = ClientSettings(**found)  # type: ignore[arg-type]
    return Client(settings.server, token=settings.token, timeout_s=settings.timeout_s)


def _printable(value: object) -> object:
    """An element JSON has no type for: bytes as text, or as base64 when not UTF-8."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode("ascii")}
    raise TypeError(f"cannot print {type(value).__name__} as JSON")


def _add_client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", help=f"server URL (FNRT_SERVER; default {DEFAULT_SERVER})")
    p.add_argument("--token", help="admin bearer token (FNRT_ADMIN_TOKEN)")


# --- serve ---------------------------------------------------------------------


def _server_settings(args: argparse.Namespace) -> ServerSettings:
    """``fnrt serve``'s settings: flags over ``FNRT_*`` and ``OTEL_*`` variables over
    defaults; ValueError names the setting it refuses."""
    found = env_server_settings()
    for flag, key in [
        ("host", "host"),
        ("port", "port"),
        ("store", "store"),
        ("cache_dir", "cache_dir"),
        ("s3_endpoint", "s3_endpoint"),
        ("disk_cache_bytes", "disk_cache_bytes"),
        ("memory_budget_bytes", "memory_budget_bytes"),
        ("admin_token", "admin_token"),
        ("max_body_bytes", "max_body_bytes"),
        ("max_json_body_bytes", "max_json_body_bytes"),
        ("max_tensor_elements", "max_tensor_elements"),
        ("max_response_bytes", "max_response_bytes"),
        ("header_timeout_s", "header_timeout_s"),
        ("body_timeout_s", "body_timeout_s"),
        ("max_connections", "max_connections"),
        ("fd_reserve", "fd_reserve"),
        ("shutdown_timeout_s", "shutdown_timeout_s"),
        ("drain_delay_s", "drain_delay_s"),
        ("watch_interval_s", "watch_interval_s"),
        ("invoke_keys_file", "invoke_keys_file"),
        ("ssl_certfile", "ssl_certfile"),
        ("ssl_keyfile", "ssl_keyfile"),
        ("max_queued", "max_queued"),
        ("isolation", "isolation"),
        ("redis_url", "redis_url"),
        ("device", "device"),
        ("log_level", "log_level"),
    ]:
        value = getattr(args, flag)
        if value is not None:
            found[key] = value
    if args.admin_token_file is not None:
        found["admin_token"] = read_token_file(args.admin_token_file)
    if args.cors_origins is not None:
        found["cors_origins"] = split_origins(args.cors_origins)
    if args.preload:
        found["preload"] = True
    if args.log_json:
        found["log_json"] = True
    if args.no_request_log:
        found["request_log"] = False
    if args.request_log_file:
        found["request_log_file"] = Path(args.request_log_file)
    trace = env_trace_settings()
    for flag, key in [
        ("trace", "exporter"),
        ("trace_endpoint", "endpoint"),
        ("trace_protocol", "protocol"),
        ("trace_sample", "sampler_ratio"),
    ]:
        value = getattr(args, flag)
        if value is not None:
            trace[key] = value
    if args.trace_sample is not None and "sampler" not in trace:
        trace["sampler"] = "parentbased_traceidratio"
    found["trace"] = TraceConfig(**trace)  # type: ignore[arg-type]
    return ServerSettings(**found)  # type: ignore[arg-type]


def cmd_serve(args: argparse.Namespace) -> int:

    from fnrt.runtime.http.app import build_app, make_server
    from fnrt.tracing.logs import configure_logging

    try:
        settings = _server_settings(args)
    except ValueError as exc:  # a setting refused (flag or variable): one line, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    configure_logging(settings.log_level, json_lines=settings.log_json)
    if settings.admin_open and not _is_loopback(settings.host):
        if not args.insecure_open_admin:
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
    app = build_app(settings)
    port = sock.getsockname()[1]
    print(f"fnrt: serving store {settings.store} on http://{settings.host}:{port}", file=sys.stderr)
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


# --- deploy --------------------------------------------------------------------


def cmd_deploy(args: argparse.Namespace) -> int:
    folder = Path(args.path)
    if not folder.is_dir():
        raise FnrtError(f"{folder} is not a folder")
    manifest = load_manifest(folder, name=args.name)
    bundle = pack(folder, manifest)
    vm = VersionManifest(manifest, bundle.code_ref, bundle.artifacts)
    show = not args.quiet and sys.stderr.isatty()
    if args.store:
        if args.policy == "canary":
            raise FnrtError("a canary needs a server to watch it: deploy with --server")
        result = _deploy_to_store(
            args.store, args.s3_endpoint or env_s3_endpoint(), bundle, vm, show
        )
    else:
        with _client(args) as client:
            count, size = upload_bundle(client, bundle, show_progress=show)
            result = client.deploy(vm, args.policy)
            result["uploaded_blobs"], result["uploaded_bytes"] = count, size
    if args.json:
        print(json.dumps(result))
    else:
        what = "deployed" if result["created"] else "already deployed"
        rollout = result.get("rollout", "immediate")
        how = {
            "canary": " (canary started: see `fnrt versions`)",
            "unchanged": " (already serving)",
        }.get(rollout, "")
        print(f"{result['name']} {result['version']} {what}{how}")
    return 0


def _deploy_to_store(
    store: str, s3_endpoint: str | None, bundle: Any, vm: VersionManifest, show: bool
) -> dict[str, Any]:
    from fnrt.loader.cache import BlobCache, CacheConfig
    from fnrt.loader.device import detect_device
    from fnrt.loader.instance import InstanceLoader
    from fnrt.loader.repository import Repository
    from fnrt.loader.stores import open_store
    from fnrt.runtime.deployment import publish_version

    repository = Repository(open_store(store, s3_config(s3_endpoint)))
    count, size = upload_bundle(repository, bundle, show_progress=show)
    with tempfile.TemporaryDirectory(prefix="fnrt-deploy-") as scratch:
        cache = BlobCache(CacheConfig(Path(scratch)))  # the handler is imported to validate it
        loader = InstanceLoader(repository, Path(scratch), detect_device("cpu"), cache)
        deployed = publish_version(repository, loader, vm)
    return {
        "name": deployed.name,
        "version": deployed.version,
        "created": deployed.created,
        "uploaded_blobs": count,
        "uploaded_bytes": size,
    }


# --- invoke --------------------------------------------------------------------


def _add_input_options(p: argparse.ArgumentParser) -> None:
    """``--json`` and ``--input``, read by :func:`_read_inputs`."""
    p.add_argument("--json", help="inputs as a JSON object, e.g. '{\"x\": [[1, 2]]}'")
    p.add_argument(
        "--input",
        "-i",
        action="append",
        metavar="FILE",
        help="inputs from a .json, .msgpack or .npz file, or NAME=FILE.npy; repeatable",
    )


def _read_inputs(args: argparse.Namespace) -> dict[str, Any]:
    inputs: dict[str, Any] = {}
    if args.json is not None:
        inputs.update(decode_json(args.json.encode()))
    for item in args.input or []:
        name, sep, path_text = item.rpartition("=")
        path = Path(path_text)
        if not path.is_file():
            raise FnrtError(f"input file {path} does not exist")
        suffix = path.suffix.lower()
        if suffix == ".npy":
            if not sep:
                raise FnrtError(f"name the input of {path}: --input NAME={path}")
            inputs[name] = np.load(path, allow_pickle=False)
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                inputs.update({k: npz[k] for k in npz.files})
        elif suffix == ".json":
            inputs.update(decode_json(path.read_bytes()))
        elif suffix in (".msgpack", ".mpk"):
            inputs.update(decode_msgpack(path.read_bytes()))
        else:
            raise FnrtError(f"{path}: use a .json, .msgpack, .npz or NAME=.npy file")
    if not inputs:
        raise FnrtError("give the inputs with --json '{...}' or --input FILE")
    return inputs


def cmd_invoke(args: argparse.Namespace) -> int:
    inputs = _read_inputs(args)
    fmt = Format.MSGPACK if args.format == "msgpack" else Format.JSON
    from fnrt.tracing.recorder import SpanKind
    from fnrt.tracing.setup import client_tracer
    from fnrt.tracing.spans import Tracing, fail, ids, inject

    config = {"service_name": "fnrt-cli", **env_trace_settings()}
    tracing = Tracing(client_tracer(TraceConfig(**config)))  # type: ignore[arg-type]
    span = tracing.start(f"fnrt invoke {args.name}", kind=SpanKind.CLIENT)
    trace_headers: dict[str, str] = {}
    inject(span, trace_headers)
    try:
        with _client(args) as client:
            result = client.invoke(args.name, inputs, format=fmt, headers=trace_headers)
    except Exception as exc:
        fail(span, exc)
        raise
    finally:
        if span is not None:
            span.end()
        tracing.shutdown()
    if args.output:
        save: Any = np.savez  # numpy's stub types **kwds as bool
        save(args.output, **{k: np.asarray(v) for k, v in result.items()})
        print(f"wrote {', '.join(result)} to {args.output}", file=sys.stderr)
    else:
        plain = {k: np.asarray(v).tolist() for k, v in result.items()}
        print(json.dumps(plain, default=_printable))
    if args.verbose:
        found = ids(span)
        trace = f", trace {found[0]}" if found else ""
        print(f"served by {result.version}{trace}", file=sys.stderr)
    return 0


# --- ls / describe / rm ----------------------------------------------------------


def cmd_ls(args: argparse.Namespace) -> int:
    with _client(args) as client:
        functions = client.list()
    if args.json:
        print(json.dumps(functions, indent=2))
        return 0
    rows = [("NAME", "VERSION", "STATE", "DESCRIPTION")] + [
        (f["name"], f["version"], f["state"], f["description"]) for f in functions
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print(
            "  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True))
            + "  "
            + row[3]
        )
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    with _client(args) as client:
        described = client.describe(args.name)
    print(json.dumps(described, indent=2) if args.json else summary.describe_text(described))
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.delete(args.name)
    print(f"removed {args.name}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from fnrt.functions.schema import manifest_schema

    print(json.dumps(manifest_schema(), indent=2))
    return 0


def _completion(parser: argparse.ArgumentParser, shell: str) -> int:
    from fnrt.runtime.cli.completion import bash_script, zsh_script

    print(bash_script(parser) if shell == "bash" else zsh_script(parser), end="")
    return 0


# --- parser --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fnrt",
        description="fnrt: deploy a model handler, get an HTTP endpoint.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"fnrt {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "serve",
        help="run the server",
        description="Run the fnrt server (Starlette on uvicorn with uvloop). "
        "Nothing is loaded until the first invoke. Sizes take units (2GiB, 512MB, or "
        "bytes) and durations too (250ms, 5m, or seconds), as flags and as variables.",
    )
    p.add_argument("--host", help="address to bind (FNRT_HOST; default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (FNRT_PORT; default 8000)")
    p.add_argument(
        "--store",
        help="object store: a folder, file://PATH or s3://bucket/prefix "
        "(FNRT_STORE; default ./.fnrt/store)",
    )
    p.add_argument(
        "--s3-endpoint", help="S3-compatible endpoint URL, e.g. MinIO (FNRT_S3_ENDPOINT)"
    )
    p.add_argument(
        "--disk-cache-bytes",
        type=_size,
        help="L2 disk cache budget (FNRT_DISK_CACHE_BYTES; 20 GiB)",
    )
    p.add_argument(
        "--memory-budget-bytes",
        type=_size,
        help="memory for loaded instances, least recently used evicted beyond it "
        "(FNRT_MEMORY_BUDGET_BYTES; default 60%% of RAM)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        help=f"local cache folder (FNRT_CACHE_DIR; e.g. {default_cache_dir()})",
    )
    p.add_argument(
        "--admin-token",
        help="require this bearer token on admin routes (FNRT_ADMIN_TOKEN; visible in ps: "
        "prefer --admin-token-file)",
    )
    p.add_argument(
        "--admin-token-file",
        type=Path,
        help="read the admin token from this file's first line (FNRT_ADMIN_TOKEN_FILE)",
    )
    p.add_argument(
        "--insecure-open-admin",
        action="store_true",
        help="serve a non-loopback address with no admin token (anyone who reaches it can "
        "deploy code); without it, fnrt serve refuses to start so",
    )
    p.add_argument(
        "--invoke-keys-file",
        type=Path,
        help='JSON {"function" or "*": ["key", ...]}: those functions answer only '
        "'Authorization: Bearer <key>' (FNRT_INVOKE_KEYS_FILE)",
    )
    p.add_argument(
        "--cors-origins",
        help="browser origins allowed to call, comma-separated, or '*' (FNRT_CORS_ORIGINS)",
    )
    p.add_argument("--ssl-certfile", type=Path, help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--ssl-keyfile", type=Path, help="the certificate's private key (PEM)")
    p.add_argument(
        "--max-queued",
        type=int,
        help="requests queued across all functions before 429 (FNRT_MAX_QUEUED; default 10000)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=_size,
        help="largest invoke body, else 413 (FNRT_MAX_BODY_BYTES; default 64 MiB)",
    )
    p.add_argument(
        "--max-json-body-bytes",
        type=_size,
        help="largest JSON body, else 413 pointing to msgpack: JSON is parsed holding the "
        "event loop (FNRT_MAX_JSON_BODY_BYTES; default 8 MiB)",
    )
    p.add_argument(
        "--max-tensor-elements",
        type=int,
        help="elements a tensor's shape may declare, a 0 dimension counting as 1, else 413 "
        "(FNRT_MAX_TENSOR_ELEMENTS; default 64 Mi)",
    )
    p.add_argument(
        "--max-response-bytes",
        type=_size,
        help="largest response, estimated before encoding, else 413 "
        "(FNRT_MAX_RESPONSE_BYTES; default 64 MiB)",
    )
    p.add_argument(
        "--header-timeout-s",
        type=_duration,
        help="a connection with no request in progress this long (a head still "
        "arriving, or none sent since the connection or the last answer) gets 408 and "
        "the connection closed (FNRT_HEADER_TIMEOUT_S; default 10)",
    )
    p.add_argument(
        "--body-timeout-s",
        type=_duration,
        help="the longest pause between reads of a request body, else the connection "
        "closed (FNRT_BODY_TIMEOUT_S; default 30)",
    )
    p.add_argument(
        "--max-connections",
        "--limit-concurrency",
        type=int,
        help="open connections at most; at the cap a new one closes the longest idle, or "
        "gets 503 when all are busy (FNRT_MAX_CONNECTIONS; default: the descriptor limit "
        "less --fd-reserve)",
    )
    p.add_argument(
        "--drain-delay-s",
        type=_duration,
        help="after SIGTERM, /readyz answers 503 at once but the node goes on accepting "
        "and serving this long, so load balancers drop it first; set it to the time your "
        "endpoints take to update, about 5 on Kubernetes (FNRT_DRAIN_DELAY_S; default 0)",
    )
    p.add_argument(
        "--watch-interval-s",
        type=_duration,
        help="how often the store's change feed is polled for deploys, traffic changes "
        "and deletes made through other nodes: one request per poll, whatever the number "
        "of functions (FNRT_WATCH_INTERVAL_S; default 1)",
    )
    p.add_argument(
        "--shutdown-timeout-s",
        type=_duration,
        help="after SIGTERM and the drain delay, how long work in flight may finish; then "
        "what is still queued or running answers 503 and the server exits, whatever handlers do "
        "(FNRT_SHUTDOWN_TIMEOUT_S; default 30)",
    )
    p.add_argument(
        "--fd-reserve",
        type=int,
        help="file descriptors kept from connections for the store, the cache and worker "
        "processes (FNRT_FD_RESERVE; default 256)",
    )
    p.add_argument(
        "--redis-url",
        help='the Redis that functions with [result_cache] backend = "redis" share with '
        "every node, e.g. redis://cache:6379/0; while it is down, calls are served "
        "uncached (FNRT_REDIS_URL; default none: such functions cache in memory)",
    )
    p.add_argument(
        "--isolation",
        choices=["process", "thread"],
        help="where a function's instances run unless its manifest's [isolation] mode says: "
        "a worker process each (a crash, a hang or a leak stays there), or a thread of the "
        "server (FNRT_ISOLATION; default process)",
    )
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        help="where instances run (FNRT_DEVICE; default auto)",
    )
    p.add_argument(
        "--preload",
        action="store_true",
        help="load every function at start instead of at first invoke",
    )
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="log level (FNRT_LOG_LEVEL; default info)",
    )
    p.add_argument("--log-json", action="store_true", help="log JSON lines (FNRT_LOG_JSON=1)")
    p.add_argument(
        "--no-request-log",
        action="store_true",
        help="no JSON line per request (FNRT_REQUEST_LOG=0)",
    )
    p.add_argument(
        "--request-log-file",
        metavar="PATH",
        help="append the request log (a JSON line per request) to PATH instead of stderr "
        "(FNRT_REQUEST_LOG_FILE)",
    )
    p.add_argument(
        "--trace",
        choices=["none", "console", "otlp"],
        help="export spans (OTEL_TRACES_EXPORTER; default none)",
    )
    p.add_argument(
        "--trace-endpoint",
        help="OTLP collector, e.g. http://127.0.0.1:4318 (OTEL_EXPORTER_OTLP_ENDPOINT)",
    )
    p.add_argument(
        "--trace-protocol",
        choices=["http/protobuf"],
        help="OTLP protocol: http/protobuf, the one fnrt speaks and every collector takes "
        "(OTEL_EXPORTER_OTLP_PROTOCOL)",
    )
    p.add_argument(
        "--trace-sample",
        type=float,
        metavar="RATIO",
        help="keep this fraction of traces that start here, follow the caller's choice "
        "otherwise (OTEL_TRACES_SAMPLER=parentbased_traceidratio, OTEL_TRACES_SAMPLER_ARG)",
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "deploy",
        help="deploy a function folder",
        description="Pack a folder holding fnrt.toml and its handler, upload the blobs the "
        "destination lacks, and move traffic to the new version. Through a server, the new "
        "version is loaded, warmed up and probed first (a failure leaves the old one serving), "
        "then gets all traffic at once or step by step as a canary that rolls back on its own. "
        "Prints the version id; the same content always gets the same id.",
    )
    p.add_argument("path", help="folder with fnrt.toml")
    p.add_argument("--name", help="function name (overrides the manifest's)")
    p.add_argument(
        "--store", help="deploy straight into this store (folder or s3://bucket/prefix), no server"
    )
    p.add_argument("--s3-endpoint", help="S3-compatible endpoint URL (FNRT_S3_ENDPOINT)")
    p.add_argument(
        "--policy",
        choices=["immediate", "canary"],
        help="how traffic moves to the new version (default: the manifest's rollout.policy)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    _add_client_options(p)
    p.set_defaults(func=cmd_deploy)

    p = sub.add_parser(
        "invoke",
        help="call a function",
        description="Invoke a function once and print its outputs as JSON "
        "(or save them with --output).",
    )
    p.add_argument("name")
    _add_input_options(p)
    p.add_argument(
        "--format",
        choices=["msgpack", "json"],
        default="msgpack",
        help="wire format (default msgpack)",
    )
    p.add_argument("--output", "-o", help="save outputs to this .npz file")
    p.add_argument("--verbose", "-v", action="store_true", help="print which version served")
    _add_client_options(p)
    p.set_defaults(func=cmd_invoke)

    p = sub.add_parser(
        "ls",
        help="list functions",
        description="List deployed functions with their version and state (cold, loading, warm).",
    )
    p.add_argument("--json", action="store_true")
    _add_client_options(p)
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser(
        "describe",
        help="show one function",
        description="Summarise a function: its inputs and outputs, traffic, rollout, "
        "requests, latency, loads and restarts. --json prints the whole document "
        "(the manifest with every default, and every counter).",
    )
    p.add_argument("name")
    p.add_argument("--json", action="store_true", help="the whole describe document as JSON")
    _add_client_options(p)
    p.set_defaults(func=cmd_describe)

    p = sub.add_parser(
        "rm",
        help="remove a function",
        description="Remove a function's routing and version manifests (blobs stay in the store).",
    )
    p.add_argument("name")
    _add_client_options(p)
    p.set_defaults(func=cmd_rm)

    p = sub.add_parser(
        "schema",
        help="print the JSON Schema of fnrt.toml (for editors)",
        description="Print the JSON Schema of a function manifest. Save it beside your "
        "fnrt.toml and start the file with '#:schema ./fnrt.schema.json': editors with a "
        "TOML language server (Taplo, Even Better TOML) then complete and check it.",
    )
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser(
        "completion",
        help="print shell completion for fnrt (bash or zsh)",
        description='Print a completion script: eval "$(fnrt completion bash)" in ~/.bashrc, '
        'or eval "$(fnrt completion zsh)" in ~/.zshrc.',
    )
    p.add_argument("shell", choices=["bash", "zsh"])
    p.set_defaults(func=lambda args: _completion(parser, args.shell))

    versions.register(sub, _client, _add_client_options)
    dev.register(sub)
    simulate.register(sub)
    edge.register(sub, _add_input_options, _read_inputs)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except ServerError as exc:
        print(f"fnrt: error {exc.status}: {exc.message}", file=sys.stderr)
        return 1
    except FnrtError as exc:
        print(f"fnrt: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
