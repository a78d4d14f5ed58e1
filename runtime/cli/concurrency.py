"""``fnrt bench-concurrency NAME``: measure how many instances should share the device."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

from fnrt.functions.errors import FnrtError
from fnrt.functions.handler import Request
from fnrt.runtime.cli.options import Listed, read_inputs
from fnrt.runtime.settings import DEFAULT_STORE, default_cache_dir


@click.command("bench-concurrency", short_help="measure the best instances per GPU for a function")
@click.argument("name")
@click.option(
    "--store",
    envvar="FNRT_STORE",
    show_envvar=True,
    show_default=DEFAULT_STORE,
    help="the object store the function is deployed to",
)
@click.option(
    "--s3-endpoint", envvar="FNRT_S3_ENDPOINT", show_envvar=True, help="S3-compatible endpoint URL"
)
@click.option(
    "--cache-dir",
    envvar="FNRT_CACHE_DIR",
    show_envvar=True,
    type=click.Path(path_type=Path),
    show_default=str(default_cache_dir()),
    help="local cache folder (the server's, to share its disk cache)",
)
@click.option(
    "--device",
    envvar="FNRT_DEVICE",
    show_envvar=True,
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="where instances run, as fnrt serve",
)
@click.option(
    "--isolation",
    type=click.Choice(["process", "thread"]),
    default="process",
    show_default=True,
    help="instances in worker processes (as fnrt serve) or threads",
)
@click.option(
    "--levels",
    type=Listed(click.IntRange(1, 256)),
    default="1,2,4,8",
    show_default=True,
    help="instance counts to try, comma-separated",
)
@click.option(
    "--clients",
    type=click.IntRange(1, 4096),
    default=64,
    show_default=True,
    help="requests in flight (each client sends its next on its answer)",
)
@click.option(
    "--warmup-s",
    type=click.FloatRange(min=0),
    default=2.0,
    show_default=True,
    help="load before the clock starts (after the level's instances are loaded)",
)
@click.option(
    "--duration-s",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    help="measured seconds per level",
)
@click.option(
    "--input",
    "-i",
    "input_files",
    multiple=True,
    metavar="FILE",
    help="the request to send: a .json, .msgpack or .npz file  [default: random values, "
    "--rows rows where a dimension is -1]",
)
@click.option(
    "--rows",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="rows of the random request where its shape says -1",
)
@click.option("--p99-limit-ms", type=click.FloatRange(min=0), help="best only among these")
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
def bench_concurrency(
    name: str,
    store: str | None,
    s3_endpoint: str | None,
    cache_dir: Path | None,
    device: str,
    isolation: str,
    levels: list[int],
    clients: int,
    warmup_s: float,
    duration_s: float,
    input_files: tuple[str, ...],
    rows: int,
    p99_limit_ms: float | None,
    as_json: bool,
) -> int:
    """Serve NAME's routed version at each level of --levels instances on this machine's
    device, under a closed loop of --clients clients through fnrt's own batcher, and
    print each level's throughput and latency, and the best level.

    Run it on the machine the function will serve on, with nothing else on the
    device; set the result as the manifest's [scaling] max_instances (or the
    node's --gpu-concurrency when several functions share the GPU).
    """
    from fnrt.functions.tensors import coerce_request
    from fnrt.runtime.concurrency import SweepConfig, best_level, sample_request, sweep
    from fnrt.runtime.node import build_node
    from fnrt.runtime.settings import ServerSettings

    found: dict[str, Any] = {"device": device, "isolation": isolation, "jobs": False}
    for key, value in (("store", store), ("s3_endpoint", s3_endpoint), ("cache_dir", cache_dir)):
        if value is not None:
            found[key] = value
    config = SweepConfig(tuple(levels), clients, warmup_s, duration_s)
    node = build_node(ServerSettings(sweep_interval_s=3600, **found), learn_keep_alive=False)

    def progress(result: Any) -> None:
        if not as_json:
            click.echo(
                f"{result.level:9d} {result.throughput_rps:12.0f} {result.p50_ms:8.2f} "
                f"{result.p99_ms:8.2f} {result.errors:7d}"
            )

    async def run() -> list[Any]:
        scheduler = await node.registry.get(name)
        vm = scheduler.version
        manifest = vm.manifest
        if manifest.generative:
            raise FnrtError(
                f"function '{name}' is generative: sweep its tokens with bench/generate.py"
            )
        request: Request = (
            coerce_request(manifest.inputs, read_inputs(None, input_files))
            if input_files
            else sample_request(manifest, rows)
        )
        if not as_json:
            click.echo(
                f"{name} {vm.version[:12]} on {node.loader.device}, {isolation} instances, "
                f"{clients} clients, {duration_s:g} s a level"
            )
            click.echo(
                f"{'instances':>9} {'requests/s':>12} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}"
            )
        return await sweep(node.registry.schedulers, vm, request, config, progress)

    results = asyncio.run(run())
    best = best_level(results, p99_limit_ms)
    if as_json:
        figures = {"results": [r.to_dict() for r in results], "best": best and best.level}
        click.echo(json.dumps(figures))
    elif best is None:
        click.echo("best: none (every level had errors or was over --p99-limit-ms)", err=True)
    else:
        click.echo(
            f"best: {best.level} instance{'s' if best.level > 1 else ''} "
            f"({best.throughput_rps:.0f} requests/s, p99 {best.p99_ms:.1f} ms)"
        )
    sys.stdout.flush()
    return 0 if best is not None else 1
