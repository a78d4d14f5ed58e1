"""What telemetry costs: throughput with tracing off, on at 10% and on at 100%.

    python bench/tracing.py [--connections 32] [--duration-s 5] [--rounds 6]
                            [--variants off,10%,100%,no-log,off-again] [--pin]

Five ``fnrt serve`` processes serve ``examples/mlp``, differing only in
telemetry: ``off`` (metrics and the request log, no spans: the baseline),
``10%`` and ``100%`` (``--trace otlp --trace-sample``, exporting to an OTLP
collector on 127.0.0.1 that accepts and drops what it gets), and
``no-log`` (``--no-request-log``, to show what the per-request JSON line
costs), and ``off-again``, a second server like ``off``: how far two identical
servers differ in this run, the margin any other ratio needs. ``wrk`` loads
each in turn, in interleaved rounds that each start with another variant (so
no variant always runs first); the table shows the median round, and the last
lines the median of the per-round ratios against ``off`` (this machine drifts
by ±10% between rounds). The CPU columns are the server's CPU time (its worker
included) per request, median over rounds, and its ratio to ``off``'s: what
telemetry costs, less blurred by the machine's drift than requests/s.

``--pin`` gives each server's process CPU 0 alone and puts everything else
(its worker, the span shipper, the collector, ``wrk``) on the other CPUs: the
server's event loop is then the bound, as on a machine with cores to spare,
rather than the whole machine's CPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import msgpack
import msgpack_numpy
import numpy as np
from loadgen import (
    Result,
    copy_mlp,
    deploy,
    pin,
    report,
    require_wrk,
    start_fnrt,
    write_script,
    wrk,
)

SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def start_sink(*prefix: str) -> tuple[str, subprocess.Popen[str]]:
    """The OTLP sink (``SINK``) in a process of its own, its command after ``prefix``
    (``taskset -c …``); its URL and process, once it listens."""
    sink = subprocess.Popen(
        [*prefix, sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True
    )
    assert sink.stdout is not None
    return f"http://127.0.0.1:{sink.stdout.readline().strip()}", sink


BASELINE = "off"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration-s", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--variants",
        default="off,10%,100%,no-log,off-again",
        help="which servers to run, comma-separated (off is always run: the baseline)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="each server's process alone on CPU 0; its children, the collector and wrk elsewhere",
    )
    args = parser.parse_args()
    require_wrk()

    work = Path(tempfile.mkdtemp(prefix="fnrt-bench-tracing-"))
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs: list[subprocess.Popen[bytes]] = []
    cpus = os.cpu_count() or 1
    if args.pin and cpus < 2:
        parser.error("--pin needs 2 CPUs or more")
    others = f"1-{cpus - 1}" if cpus > 2 else "1"
    wrk_cpus = others if args.pin else None
    pinned = ["taskset", "-c", others] if args.pin else []
    collector, sink = start_sink(*pinned)
    try:
        example, _ = copy_mlp(work)
        variants = {
            "off": [],
            "10%": ["--trace", "otlp", "--trace-endpoint", collector, "--trace-sample", "0.1"],
            "100%": ["--trace", "otlp", "--trace-endpoint", collector, "--trace-sample", "1.0"],
            "no-log": ["--no-request-log"],
            "off-again": [],  # a second server like "off": the noise floor of the run
        }
        chosen = {"off", *args.variants.split(",")}
        unknown = chosen - set(variants)
        if unknown:
            parser.error(f"--variants: no such variant {sorted(unknown)}; known: {list(variants)}")
        variants = {name: extra for name, extra in variants.items() if name in chosen}
        x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
        body = msgpack.packb({"x": x}, default=msgpack_numpy.encode)
        script = write_script(work, "invoke", "application/msgpack", body)
        urls, pids = {}, {}
        for i, (name, extra) in enumerate(variants.items()):
            store = work / f"store-{i}"
            with open(work / f"{i}.log", "wb") as logs:  # the request log goes here
                server, proc = start_fnrt(str(store), work / f"cache-{i}", env, *extra, stderr=logs)
            procs.append(proc)
            deploy(server, example)
            urls[name] = f"{server}/v1/functions/mlp/invoke"
            pids[name] = proc.pid
            wrk(urls[name], script, args.connections, 1, cpus=wrk_cpus)  # warm up: loads it
            if args.pin:
                pin(proc.pid, "0", others)

        results: dict[str, list[Result]] = {name: [] for name in variants}
        names = list(urls)
        for round_ in range(args.rounds):  # each round starts with another variant
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                results[name].append(
                    wrk(
                        urls[name],
                        script,
                        args.connections,
                        args.duration_s,
                        pids[name],
                        cpus=wrk_cpus,
                    )
                )

        print(
            f"\nmlp example, {args.connections} connections, "
            f"{args.duration_s}s x {args.rounds} rounds (median round)"
            f"{', each server alone on CPU 0' if args.pin else ''}\n"
        )
        report(results, BASELINE, "telemetry")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
        sink.terminate()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
