"""``fnrt edge run`` and ``fnrt edge plan``: split inference from this machine.

``run`` wraps :class:`fnrt.edge.client.EdgeClient`: it runs the head of the
planned split here, sends the activation and prints the outputs. ``plan``
prints what the planner sees: this device's and the server's time per
segment, what crosses the network, and the predicted latency of every split.
Both can emulate a slower device and link (``--emulate-*``) to try plans.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from fnrt.runtime.cli.options import input_options, server_option
from fnrt.runtime.settings import default_cache_dir, env_trace_settings

if TYPE_CHECKING:
    from fnrt.edge.client import EdgeResult

F = TypeVar("F")


@dataclass(frozen=True)
class EdgeOptions:
    """What ``run`` and ``plan`` share: the function, the server, and the link."""

    name: str
    server: str
    cache_dir: Path | None
    split: int | None
    encoding: str
    threads: int
    emulate_bandwidth: float | None
    emulate_rtt_ms: float
    emulate_slowdown: float
    key: str | None


def _client(options: EdgeOptions, tracer: Any = None) -> Any:
    from fnrt.edge.activation import Encoding
    from fnrt.edge.client import EdgeClient, EdgeConfig
    from fnrt.edge.transport import HttpTransport, Throttled, Transport

    try:  # an option's value out of range: a usage error naming it, not a traceback
        config = EdgeConfig(
            cache_dir=options.cache_dir or default_cache_dir() / "edge",
            encoding=Encoding.parse(options.encoding),
            split=options.split,
            threads=options.threads,
            emulate_slowdown=options.emulate_slowdown,
        )
        transport: Transport = HttpTransport(options.server, config.timeout_s, options.key)
        if options.emulate_bandwidth is not None:
            transport = Throttled(transport, options.emulate_bandwidth, options.emulate_rtt_ms)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    return EdgeClient(options.server, options.name, config, transport=transport, tracer=tracer)


def edge_options(command: F) -> F:
    """NAME and the options of :class:`EdgeOptions`, given to ``command`` as ``edge``."""

    @functools.wraps(command)  # type: ignore[arg-type]
    def run(*args: Any, **kw: Any) -> Any:
        fields = EdgeOptions.__dataclass_fields__
        options = EdgeOptions(**{k: kw.pop(k) for k in list(kw) if k in fields})
        return command(*args, edge=options, **kw)  # type: ignore[operator]

    for option in (
        click.option(
            "--emulate-slowdown",
            type=float,
            default=1.0,
            show_default=True,
            metavar="X",
            help="emulate a device X times slower than this machine",
        ),
        click.option(
            "--emulate-rtt-ms",
            type=float,
            default=20.0,
            show_default=True,
            help="the emulated link's round trip",
        ),
        click.option(
            "--emulate-bandwidth",
            type=float,
            metavar="BYTES_PER_S",
            help="emulate a link of this bandwidth (and --emulate-rtt-ms)",
        ),
        click.option(
            "--threads", type=int, default=1, show_default=True, help="onnxruntime threads here"
        ),
        click.option(
            "--encoding",
            type=click.Choice(["float32", "float16", "int8"]),
            default="float32",
            show_default=True,
            help="how the activation travels",
        ),
        click.option("--split", type=int, help="use this split instead of planning"),
        click.option(
            "--key",
            envvar="FNRT_INVOKE_KEY",
            show_envvar=True,
            help="the function's invoke key, where it has keys (sent as Authorization: "
            "Bearer with the plan, heads and tails)",
        ),
        click.option(
            "--cache-dir",
            type=click.Path(path_type=Path),
            show_default="~/.cache/fnrt/edge",
            help="where heads and the plan are kept",
        ),
        server_option,
        click.argument("name"),
    ):
        run = option(run)
    return run  # type: ignore[return-value]


@click.group(short_help="split inference: the first layers here, the rest on fnrt")
def edge() -> None:
    """Run a split-capable function's head on this machine and its tail on the
    server, at the split the planner picks for the measured link (docs/edge.md)."""


@edge.command(short_help="answer inputs with split inference")
@edge_options
@input_options
@click.option(
    "--repeat", type=click.IntRange(min=1), default=1, show_default=True, help="run this many times"
)
@click.option(
    "--output", "-o", type=click.Path(path_type=Path), help="save outputs to this .npz file"
)
@click.option("--verbose", "-v", is_flag=True, help="print the split, times and link")
def run(
    edge: EdgeOptions,
    inputs: dict[str, Any],
    repeat: int,
    output: Path | None,
    verbose: bool,
) -> int:
    """Fetch the plan and heads (cached, verified), run the head of the planned split
    here, send the activation, print the outputs as JSON. Runs the whole model here
    when the server cannot be reached and it fits."""
    import numpy as np

    from fnrt.tracing.setup import TraceConfig, client_tracer

    arrays = {k: np.asarray(v) for k, v in inputs.items()}
    settings: dict[str, Any] = {"service_name": "fnrt-edge", **env_trace_settings()}
    tracer = client_tracer(TraceConfig(**settings))
    try:
        with _client(edge, tracer) as client:
            for _ in range(repeat):
                result = client.run(arrays)
                if verbose:
                    where = "offline, all here" if result.offline else f"split {result.split}"
                    print(f"{where} of {client.splits - 1}: {_accounted(result)}", file=sys.stderr)
                    print(f"  link {_link(client)}", file=sys.stderr)
    finally:
        tracer.shutdown()
    if output:
        save: Any = np.savez
        save(output, **result.outputs)
        print(f"wrote {', '.join(result.outputs)} to {output}", file=sys.stderr)
    else:
        print(json.dumps({k: v.tolist() for k, v in result.outputs.items()}))
    return 0


@edge.command(short_help="show the split plan")
@edge_options
def plan(edge: EdgeOptions) -> int:
    """Show each split's bytes sent, device and server time and predicted latency
    over the measured link, and the split the planner picks (or, with --split, the one
    given)."""
    with _client(edge) as client:
        plan = client.plan()
        profile = client.profile()
        data = client.data
    names = ["(inputs)", *(p["name"] for p in data["points"]), "(all here)"]
    last = len(names) - 1
    print(f"{edge.name} {data['version']}: link {_link(client)}")
    header = ("SPLIT", "AFTER", "SENT", "DEVICE MS", "SERVER MS", "PREDICTED MS")
    print("{:>5}  {:<12} {:>10} {:>10} {:>10} {:>13}".format(*header))
    for k, name in enumerate(names):
        sent = "-" if k == last else f"{profile.sent_bytes[k]:,}"
        device = sum(profile.device_ms[:k])
        server = sum(profile.server_ms[k:])
        mark = "  <- planned" if k == plan.split else ""
        if edge.split is not None:  # --split: the one a run would use, not the planner's
            mark = "  <- --split" if k == edge.split else ""
        predicted = plan.predicted_ms[k]
        print(
            f"{k:>5}  {name:<12} {sent:>10} {device:>10.2f} {server:>10.2f} "
            f"{predicted:>13.2f}{mark}"
        )
    return 0


def _accounted(r: EdgeResult) -> str:
    """Where one call's time went, every part named (the first call plans: it fetches
    the plan and the heads and times them)."""
    parts = [("plan", r.plan_ms), ("head", r.head_ms), ("encode", r.encode_ms)]
    parts += [("request", r.request_ms), ("other", r.other_ms)]
    named = ", ".join(f"{name} {ms:.1f}" for name, ms in parts if ms >= 0.05 or name == "head")
    server = f" (server {r.server_ms:.1f} of the request)" if r.request_ms else ""
    return f"{r.total_ms:.1f} ms = {named}{server}"


def _link(client: Any) -> str:
    link = client.link.link
    if link is None:
        return "not measured"
    return f"{link.bandwidth_bytes_per_s / 1e6:.3g} MB/s, RTT {link.rtt_ms:.1f} ms"
