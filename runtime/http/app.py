"""The Starlette application: routes, error handlers, start-up and shut-down."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import math
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

from fnrt.functions.errors import FnrtError
from fnrt.runtime.clock import Clock
from fnrt.runtime.collector import COLLECTOR
from fnrt.runtime.http import admin, health, jobs, openapi, split
from fnrt.runtime.http.body import Receive
from fnrt.runtime.http.connection import (
    ConnectionLimits,
    DataApps,
    close_after_answer,
    connection_cap,
    guarded_protocol,
    raise_descriptor_limit,
)
from fnrt.runtime.http.data import Bound, Scope, Send, match, starlette_routes
from fnrt.runtime.http.generate import GENERATE, OIP_GENERATE
from fnrt.runtime.http.invoke import INVOKE, SERVED_HEADERS
from fnrt.runtime.http.oip import routes as oip_routes
from fnrt.runtime.http.oip.infer import INFER, INFER_VERSION
from fnrt.runtime.http.oip.wire import HEADER_LENGTH
from fnrt.runtime.http.problems import (
    fnrt_error_handler,
    http_error_handler,
    unexpected_error_handler,
)
from fnrt.runtime.http.split import SPLIT
from fnrt.runtime.node import Node, build_node
from fnrt.runtime.settings import ServerSettings
from fnrt.tracing.access import AccessLog
from fnrt.tracing.metrics import Metrics
from fnrt.tracing.setup import build_tracer
from fnrt.tracing.spans import Tracing
from fnrt.tracing.telemetry import Telemetry

log = logging.getLogger("fnrt.server")


#: New objects (net of those freed) between two young-generation collections, in a
#: serving process; Python's default is 700. Under load the requests in flight
#: hold more new objects than that, so each young collection walked mostly live
#: requests and moved them on to be walked again in older generations (3 to 5 µs
#: a request in a busy server, measured with ``gc.callbacks``). At this many a
#: request's objects are freed before a collection sees them; garbage in reference
#: cycles waits longer to be freed (a few MB at most).
YOUNG_COLLECTION_OBJECTS = 10_000

#: Every data route, once (``http/data.py``): FnrtApp answers them before Starlette's
#: router, in this order; the same table makes them ordinary routes too, which serve
#: only when that is bypassed and give other methods a 405 with ``Allow``.
DATA_ROUTES = (INVOKE, INFER, INFER_VERSION, SPLIT, GENERATE, *OIP_GENERATE)


#: How many data routes' paths a server keeps matched (a function's invoke path, say).
DATA_PATHS_KEPT = 1024
#: The longest path kept: a function's name is 63 characters at most, so a longer path
#: names nothing served (it is matched each time, and answered 404). Kept, 1,024 paths
#: of 60 KB held 120 MiB (the path, and the name in its parameters).
DATA_PATH_KEPT_CHARS = 512


class FnrtApp(Starlette):
    """Starlette, with the data routes (the hot path) answered before its middleware
    and router."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            found = match(DATA_ROUTES, scope["path"])
            if found is not None:
                item, params = found
                await item.serve(self.state.node, params, scope, receive, send)
                return
        await Starlette.__call__(self, scope, receive, send)


class CorsFnrtApp(FnrtApp):
    """:class:`FnrtApp` behind CORS: preflights answered and responses marked for the
    allowed browser origins. A class of its own, so a server without CORS pays no
    frame for it on the hot path."""

    origins: tuple[str, ...] = ()

    @functools.cached_property
    def _cors(self) -> ASGIApp:
        return CORSMiddleware(
            super().__call__,
            allow_origins=list(self.origins),
            allow_methods=["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"],
            allow_headers=["*"],
            expose_headers=[*SERVED_HEADERS, "retry-after", HEADER_LENGTH],
            max_age=600,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._cors(scope, receive, send)


def connection_limits(settings: ServerSettings) -> ConnectionLimits:
    """Read deadlines and the connection cap: below this process's descriptor limit
    (raised to its hard limit first) by ``fd_reserve``."""
    descriptors = raise_descriptor_limit()
    cap = connection_cap(settings.max_connections, descriptors, settings.fd_reserve)
    return ConnectionLimits(
        settings.header_timeout_s,
        settings.body_timeout_s,
        cap,
        settings.min_body_rate_bytes_s,
        settings.body_rate_window_s,
    )


def data_apps(app: Starlette) -> DataApps | None:
    """The data routes of ``app``, for its connections to answer without the app's
    own dispatch (``connection.GuardedProtocol``): the same routes ``FnrtApp``
    matches first. None where something must see every request first (CORS), or
    for an app that is not fnrt's."""
    if type(app).__call__ is not FnrtApp.__call__:
        return None
    node = app.state.node
    served: dict[str, Any] = {}  # path -> its route with its parameters, as found last

    def find(path: str) -> Any:
        route = served.get(path)
        if route is None:
            found = match(DATA_ROUTES, path)
            if found is None:
                return None
            item, params = found
            route = Bound(item, node, params)
            if len(path) <= DATA_PATH_KEPT_CHARS:
                if len(served) >= DATA_PATHS_KEPT:  # paths come and go: forget them all
                    served.clear()
                served[path] = route
        return route

    return find


def server_config(app: Starlette, settings: ServerSettings) -> Any:
    """The ``uvicorn.Config`` every fnrt server runs with (``fnrt serve``, ``fnrt dev``):
    uvloop and httptools (guarded: ``connection.py``), uvicorn's own access log off
    (fnrt writes its own)."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=guarded_protocol(
            connection_limits(settings), app.state.node.lifecycle, data_apps(app)
        ),
        log_level=settings.log_level,
        access_log=False,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_timeout_s),
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
    )


def make_server(app: Starlette, settings: ServerSettings) -> Any:
    """A ``uvicorn.Server`` for ``app`` that stops as an orchestrator expects.

    At SIGTERM (or SIGINT) ``/readyz`` answers 503 at once; for ``drain_delay_s``
    the node goes on accepting and serving (endpoints take that long to drop it),
    answering with ``Connection: close``; then it stops accepting and finishes what
    it accepted. Shutdown ends within its timeout whatever handlers do: while
    uvicorn waits for requests in flight the node drains, and past
    ``shutdown_timeout_s`` (less a second to answer) what is still queued or
    running answers 503 and hung instances are abandoned."""
    import uvicorn

    node: Node = app.state.node

    class FnrtServer(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if sockets is not None and self.started:  # bound by fnrt serve: say so as uvicorn
                self._log_started_message(sockets)

        def handle_exit(self, sig: int, frame: Any) -> None:
            node.lifecycle.drain()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                yield
                # SIGTERM is the way to stop a server (Kubernetes, systemd): once it has
                # stopped gracefully, exit 0 rather than die of the signal re-raised.
                self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]

        async def shutdown(self, sockets: Any = None) -> None:
            node.lifecycle.drain()
            close_after_answer(self.server_state.connections)
            loop = asyncio.get_running_loop()
            accepting_until = loop.time() + settings.drain_delay_s
            if settings.drain_delay_s:
                log.info("draining: still accepting for %.1f s", settings.drain_delay_s)
            while loop.time() < accepting_until and not self.force_exit:
                await asyncio.sleep(0.05)
            drain_s = max(settings.shutdown_timeout_s - 1.0, 0.5)
            draining = asyncio.ensure_future(node.drain(drain_s))
            try:
                await super().shutdown(sockets)
            finally:
                draining.cancel()

    return FnrtServer(server_config(app, settings))


def build_telemetry(settings: ServerSettings) -> Telemetry:
    """Spans as ``settings.trace`` says, metrics, and the request log."""
    return Telemetry(
        Tracing(build_tracer(settings.trace, shipped=True)),
        Metrics(),
        _access_log(settings),
    )


def _access_log(settings: ServerSettings) -> AccessLog | None:
    if not settings.request_log:
        return None
    if settings.request_log_file is None:
        return AccessLog()
    settings.request_log_file.parent.mkdir(parents=True, exist_ok=True)
    return AccessLog(settings.request_log_file.open("ab"), owns_stream=True)


def build_app(
    settings: ServerSettings,
    node: Node | None = None,
    telemetry: Telemetry | None = None,
    clock: Clock | None = None,
) -> Starlette:
    """The fnrt HTTP application over ``node`` (built from ``settings`` when None).
    Nothing is loaded until the first invoke (or at start for functions with
    ``load_at_start`` / ``--preload``).

    Tests pass their own ``node``, or a ``telemetry`` (an in-memory span
    exporter, say) or ``clock`` for the node built here.
    """
    if node is None:
        telemetry = telemetry or build_telemetry(settings)
        node = build_node(settings, clock=clock, telemetry=telemetry)
    serving = node

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await serving.start()
        COLLECTOR.freeze()  # start-up objects never need collecting (see Loads.loaded)
        thresholds = gc.get_threshold()
        gc.set_threshold(YOUNG_COLLECTION_OBJECTS, *thresholds[1:])
        try:
            yield
        finally:
            gc.set_threshold(*thresholds)
            serving.lifecycle.drain()
            await serving.close(settings.shutdown_timeout_s)
            serving.lifecycle.stopped()
            serving.telemetry.close()  # export the spans and log lines still buffered

    origins = node.settings.cors_origins
    app_class: type[FnrtApp] = (
        type("FnrtApp", (CorsFnrtApp,), {"origins": origins}) if origins else FnrtApp
    )
    app = app_class(
        routes=[
            *starlette_routes(DATA_ROUTES),
            *admin.routes,
            *health.routes,
            *jobs.routes,
            *oip_routes.routes,
            *openapi.routes,
            *split.routes,
        ],
        exception_handlers={
            FnrtError: fnrt_error_handler,
            HTTPException: http_error_handler,
            Exception: unexpected_error_handler,
        },
        lifespan=lifespan,
    )
    app.state.node = node
    return app
