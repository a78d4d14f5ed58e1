"""``fnrt dev PATH``: serve one handler folder and redeploy it on every change."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import click

from fnrt.functions.errors import FnrtError
from fnrt.runtime.cli.options import LOG_LEVEL, host_option, port_option


@click.command(short_help="serve one folder, redeploying on every change")
@click.argument("path", type=click.Path(path_type=Path))
@host_option
@port_option
@click.option("--store", help="object store  [default: a temporary folder]")
@click.option("--log-level", type=LOG_LEVEL, default="warning", show_default=True, help="log level")
def dev(path: Path, host: str | None, port: int | None, store: str | None, log_level: str) -> int:
    """Serve the function in PATH (a folder with fnrt.toml) and watch the folder.

    A change to its code, manifest or weights deploys a new version and swaps it
    in without restarting (within about a second for a small model). A change
    that breaks the handler prints the error and the last good version keeps
    serving.
    """

    from fnrt.runtime.dev import Reload, watch
    from fnrt.runtime.http.app import build_app, make_server
    from fnrt.runtime.settings import ServerSettings
    from fnrt.tracing.logs import configure_logging

    folder = path.resolve()
    if not (folder / "fnrt.toml").is_file():
        raise FnrtError(f"{folder} has no fnrt.toml")
    scratch = tempfile.TemporaryDirectory(prefix="fnrt-dev-")
    bound = {"host": host, "port": port}  # --host, --port, FNRT_HOST, FNRT_PORT: as fnrt serve
    settings = ServerSettings(
        **{k: v for k, v in bound.items() if v is not None},  # type: ignore[arg-type]
        store=store or str(Path(scratch.name) / "store"),
        cache_dir=Path(scratch.name) / "cache",
        log_level=log_level,
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
