"""``fnrt dev PATH``: serve one handler folder and redeploy it on every change."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from fnrt.functions.errors import FnrtError


def cmd_dev(args: argparse.Namespace) -> int:

    from fnrt.runtime.dev import Reload, watch
    from fnrt.runtime.http.app import build_app, make_server
    from fnrt.runtime.settings import ServerSettings, env_server_settings
    from fnrt.tracing.logs import configure_logging

    folder = Path(args.path).resolve()
    if not (folder / "fnrt.toml").is_file():
        raise FnrtError(f"{folder} has no fnrt.toml")
    scratch = tempfile.TemporaryDirectory(prefix="fnrt-dev-")
    store = args.store or str(Path(scratch.name) / "store")
    found = env_server_settings()  # FNRT_HOST and FNRT_PORT, as fnrt serve reads them
    env_port = found.get("port")
    settings = ServerSettings(
        host=args.host or str(found.get("host", "127.0.0.1")),
        port=args.port
        if args.port is not None
        else (env_port if isinstance(env_port, int) else 8000),
        store=store,
        cache_dir=Path(scratch.name) / "cache",
        log_level=args.log_level,
    )
    configure_logging(settings.log_level)
    app = build_app(settings)
    node = app.state.node
    server = make_server(app, settings)

    def report(reload: Reload) -> None:
        if reload.error is not None:
            print(
                f"fnrt dev: not deployed, the last good version keeps serving: {reload.error}",
                file=sys.stderr,
                flush=True,
            )
        else:
            print(
                f"fnrt dev: serving {reload.version} (deployed in {reload.took_s:.2f}s)",
                file=sys.stderr,
                flush=True,
            )

    async def main() -> None:
        serving = asyncio.ensure_future(server.serve())
        while not server.started and not serving.done():
            await asyncio.sleep(0.02)
        if serving.done():
            serving.result()
            return
        print(
            f"fnrt dev: watching {folder}; http://{settings.host}:{settings.port}",
            file=sys.stderr,
            flush=True,
        )
        stop = asyncio.Event()
        watching = asyncio.ensure_future(watch(node, folder, report, stop))
        await serving
        stop.set()
        await watching

    try:
        import uvloop

        uvloop.run(main())
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it stopped on: a normal exit
        pass
    finally:
        scratch.cleanup()
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "dev",
        help="serve one folder, redeploying on every change",
        description="Serve the function in PATH and watch the folder: a change to its code, "
        "manifest or weights deploys a new version and swaps it in without restarting "
        "(within about a second for a small model). A change that breaks the handler "
        "prints the error and the last good version keeps serving.",
    )
    p.add_argument("path", help="folder with fnrt.toml")
    p.add_argument("--host", help="address to bind (FNRT_HOST; default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (FNRT_PORT; default 8000)")
    p.add_argument("--store", help="object store (default: a temporary folder)")
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="warning",
        help="log level (default warning)",
    )
    p.set_defaults(func=cmd_dev)
