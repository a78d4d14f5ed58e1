"""``fnrt edge run`` and ``fnrt edge plan``: split inference from this machine.

``run`` wraps :class:`fnrt.edge.client.EdgeClient`: it runs the head of the
planned split here, sends the activation and prints the outputs. ``plan``
prints what the planner sees: this device's and the server's time per
segment, what crosses the network, and the predicted latency of every split.
Both can emulate a slower device and link (``--emulate-*``) to try plans.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fnrt.runtime.settings import DEFAULT_SERVER, default_cache_dir, env_trace_settings

if TYPE_CHECKING:
    from fnrt.edge.client import EdgeResult

ReadInputs = Callable[[argparse.Namespace], dict[str, Any]]


def _client(args: argparse.Namespace, tracer: Any = None) -> Any:
    from fnrt.edge.activation import Encoding
    from fnrt.edge.client import EdgeClient, EdgeConfig
    from fnrt.edge.transport import HttpTransport, Throttled, Transport

    server = args.server or os.environ.get("FNRT_SERVER", DEFAULT_SERVER)
    config = EdgeConfig(
        cache_dir=Path(args.cache_dir) if args.cache_dir else default_cache_dir() / "edge",
        encoding=Encoding.parse(args.encoding),
        split=args.split,
        threads=args.threads,
        emulate_slowdown=args.emulate_slowdown,
    )
    transport: Transport = HttpTransport(server, config.timeout_s)
    if args.emulate_bandwidth is not None:
        transport = Throttled(transport, args.emulate_bandwidth, args.emulate_rtt_ms)
    return EdgeClient(server, args.name, config, transport=transport, tracer=tracer)


def cmd_run(args: argparse.Namespace, read_inputs: ReadInputs) -> int:
    from fnrt.tracing.setup import TraceConfig, client_tracer

    inputs = {k: np.asarray(v) for k, v in read_inputs(args).items()}
    settings: dict[str, Any] = {"service_name": "fnrt-edge", **env_trace_settings()}
    tracer = client_tracer(TraceConfig(**settings))
    try:
        with _client(args, tracer) as client:
            for _ in range(args.repeat):
                result = client.run(inputs)
                if args.verbose:
                    where = "offline, all here" if result.offline else f"split {result.split}"
                    print(f"{where} of {client.splits - 1}: {_accounted(result)}", file=sys.stderr)
                    print(f"  link {_link(client)}", file=sys.stderr)
    finally:
        tracer.shutdown()
    if args.output:
        save: Any = np.savez
        save(args.output, **result.outputs)
        print(f"wrote {', '.join(result.outputs)} to {args.output}", file=sys.stderr)
    else:
        print(json.dumps({k: v.tolist() for k, v in result.outputs.items()}))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    with _client(args) as client:
        plan = client.plan()
        profile = client.profile()
        data = client.data
    names = ["(inputs)", *(p["name"] for p in data["points"]), "(all here)"]
    last = len(names) - 1
    print(f"{args.name} {data['version']}: link {_link(client)}")
    header = ("SPLIT", "AFTER", "SENT", "DEVICE MS", "SERVER MS", "PREDICTED MS")
    print("{:>5}  {:<12} {:>10} {:>10} {:>10} {:>13}".format(*header))
    for k, name in enumerate(names):
        sent = "-" if k == last else f"{profile.sent_bytes[k]:,}"
        device = sum(profile.device_ms[:k])
        server = sum(profile.server_ms[k:])
        mark = "  <- planned" if k == plan.split else ""
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


def register(
    sub: Any, add_input_options: Callable[[argparse.ArgumentParser], None], read_inputs: ReadInputs
) -> None:
    edge = sub.add_parser(
        "edge",
        help="split inference: the first layers here, the rest on fnrt",
        description="Run a split-capable function's head on this machine and its tail on "
        "the server, at the split the planner picks for the measured link (docs/edge.md).",
    )
    commands = edge.add_subparsers(dest="edge_command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("name")
        p.add_argument("--server", help=f"server URL (FNRT_SERVER; default {DEFAULT_SERVER})")
        p.add_argument(
            "--cache-dir", help="where heads and the plan are kept (default ~/.cache/fnrt/edge)"
        )
        p.add_argument("--split", type=int, help="use this split instead of planning")
        p.add_argument(
            "--encoding",
            choices=["float32", "float16", "int8"],
            default="float32",
            help="how the activation travels (default float32)",
        )
        p.add_argument("--threads", type=int, default=1, help="onnxruntime threads here")
        p.add_argument(
            "--emulate-bandwidth",
            type=float,
            metavar="BYTES_PER_S",
            help="emulate a link of this bandwidth (and --emulate-rtt-ms)",
        )
        p.add_argument("--emulate-rtt-ms", type=float, default=20.0, help="default 20")
        p.add_argument(
            "--emulate-slowdown",
            type=float,
            default=1.0,
            metavar="X",
            help="emulate a device X times slower than this machine",
        )

    p = commands.add_parser(
        "run",
        help="answer inputs with split inference",
        description="Fetch the plan and heads (cached, verified), run the head of the "
        "planned split here, send the activation, print the outputs as JSON. Runs the "
        "whole model here when the server cannot be reached and it fits.",
    )
    common(p)
    add_input_options(p)
    p.add_argument("--repeat", type=int, default=1, help="run this many times (default 1)")
    p.add_argument("--output", "-o", help="save outputs to this .npz file")
    p.add_argument("--verbose", "-v", action="store_true", help="print the split, times and link")
    p.set_defaults(func=lambda args: cmd_run(args, read_inputs))

    p = commands.add_parser(
        "plan",
        help="show the split plan",
        description="Show each split's bytes sent, device and server time and predicted "
        "latency over the measured link, and the split the planner picks.",
    )
    common(p)
    p.set_defaults(func=cmd_plan)
