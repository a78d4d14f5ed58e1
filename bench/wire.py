"""What one request costs fnrt's event loop over a real socket, HTTP included: counted.

``bench/hotpath.py`` drives the ASGI app in process and leaves out the HTTP
server; this counts the whole of it. Each variant is ``fnrt serve``'s own
server (``build_app`` and ``make_server``: uvicorn, uvloop, httptools and
fnrt's guarded protocol) on a free 127.0.0.1 port in a process of its own,
with ``examples/mlp`` deployed and loaded; a client in another process sends
``--requests`` JSON invokes over ``--connections`` keep-alive connections and
reads every answer, while ``sys.settrace`` with opcode events counts the
Python bytecodes the server's event-loop thread runs. Counts, not times: the
machine may be shared. The batches a traced server makes are larger than an
untraced one's (it runs slower), so a batch's share of the count is smaller
than at full speed; a request's own work (HTTP parsing, the ASGI cycle, the
route) is counted whole.

``--baseline REV`` counts the fnrt packages of commit ``REV`` too (a ``git
archive`` of it first on ``PYTHONPATH``), in the same run:

    python bench/wire.py --baseline HEAD --requests 3000
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from hotpath import Where, deploy_example, opcode_counter  # noqa: E402
from invoke import checkout  # noqa: E402
from loadgen import copy_mlp, free_port  # noqa: E402

#: The invoke every request sends: one row of ``mlp``'s 64 inputs.
BODY = json.dumps({"x": [[0.01 * i for i in range(64)]]}).encode()


def request_bytes(port: int) -> bytes:
    head = (
        f"POST /v1/functions/mlp/invoke HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(BODY)}\r\n\r\n"
    )
    return head.encode() + BODY


async def client(port: int, connections: int, requests: int) -> None:
    """Send ``requests`` invokes over ``connections`` connections, one at a time on
    each, and read every answer whole (raises on any status but 200)."""
    message = request_bytes(port)
    per = [requests // connections + (i < requests % connections) for i in range(connections)]

    async def one(count: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(count):
            writer.write(message)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace"))
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
        writer.close()

    await asyncio.gather(*(one(n) for n in per if n))


def run_client(port: int, connections: int, requests: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, __file__, "--client", str(port), str(connections), str(requests)]
    return subprocess.Popen(argv)


async def serve_and_count(args: argparse.Namespace, work: Path) -> None:
    """In the variant's own process: serve, warm, count, print the counts as JSON."""
    import uvloop  # noqa: F401  (uvicorn's loop)

    from fnrt.runtime.http.app import build_app, make_server
    from fnrt.runtime.settings import ServerSettings

    example, _ = copy_mlp(work)
    port = free_port()
    settings = ServerSettings(
        host="127.0.0.1",
        port=port,
        store=str(work / "store"),
        cache_dir=work / "cache",
        request_log_file=work / "requests.log",  # on, as in production
        log_level="warning",
    )
    app = build_app(settings)
    server = make_server(app, settings)
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    await deploy_example(app.state.node, example)

    async def drive(requests: int) -> None:
        proc = run_client(port, args.connections, requests)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, proc.wait)  # waited for on a thread not counted
        if proc.returncode:
            raise RuntimeError(f"the client failed: {proc.returncode}")

    await drive(args.connections * 20)  # loads the model, warms every connection's path
    counts: collections.Counter[Where] = collections.Counter()
    calls: collections.Counter[Where] = collections.Counter()
    sys.settrace(opcode_counter(counts, calls))
    try:
        await drive(args.requests)
    finally:
        sys.settrace(None)
    server.should_exit = True
    await serving
    top = sorted(counts.items(), key=lambda kv: -kv[1])
    print(
        json.dumps(
            {
                "bytecodes": sum(counts.values()) / args.requests,
                "calls": sum(calls.values()) / args.requests,
                "top": [[list(k), v / args.requests] for k, v in top],
            }
        )
    )


def short(path: str) -> str:
    """A baseline's file named as the working tree's (its overlay prefix dropped)."""
    return path.split("baseline-overlay/fnrt/", 1)[-1]


def package(path: str) -> str:
    """The part of the stack a file belongs to: a site package, or fnrt's folder."""
    parts = path.split("/")
    if parts[0] == "runtime" and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0] if len(parts) > 1 else path


def count(variant: str, overlay: Path | None, args: argparse.Namespace, work: Path) -> Any:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if overlay is not None:
        env["PYTHONPATH"] = str(overlay)
    folder = work / variant
    folder.mkdir()
    argv = [sys.executable, __file__, "--variant-dir", str(folder)]
    argv += ["--requests", str(args.requests), "--connections", str(args.connections)]
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--baseline", help="a commit to count beside the working tree")
    parser.add_argument("--top", type=int, default=30, help="functions listed")
    parser.add_argument("--variant-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        asyncio.run(client(*args.client))
        return
    if args.variant_dir:
        import uvloop

        uvloop.run(serve_and_count(args, args.variant_dir))
        return
    work = Path(tempfile.mkdtemp(prefix="fnrt-wire-"))
    try:
        found: dict[str, Any] = {}
        started = time.monotonic()
        if args.baseline:
            found["base"] = count("base", checkout(args.baseline, work), args, work)
        found["now"] = count("now", None, args, work)
        names = list(found)
        print(
            f"\nexamples/mlp over HTTP, {args.connections} connections, {args.requests} requests"
            f" ({time.monotonic() - started:.0f} s); the server's event-loop thread\n"
        )
        print(f"{'variant':<8} {'bytecodes/req':>14} {'ratio':>7} {'calls/req':>10}")
        for name in names:
            ratio = found[name]["bytecodes"] / found[names[0]]["bytecodes"]
            print(
                f"{name:<8} {found[name]['bytecodes']:>14,.0f} {ratio:>6.2f}x"
                f" {found[name]['calls']:>10,.1f}"
            )
        per = {
            name: {(short(k[0]), k[1], k[2]): v for k, v in found[name]["top"]} for name in names
        }
        print("\nby package (bytecodes a request)\n")
        print("".join(f"{name:>9}" for name in names) + "  package")
        groups = {name: collections.Counter() for name in names}
        for name in names:
            for (path, _, _), v in per[name].items():
                groups[name][package(path)] += v
        for group in sorted(
            {g for c in groups.values() for g in c}, key=lambda g: -groups[names[-1]][g]
        ):
            print("".join(f"{groups[name][group]:>9.0f}" for name in names) + f"  {group}")
        keys = sorted(
            {k for p in per.values() for k in p},
            key=lambda k: -max(p.get(k, 0) for p in per.values()),
        )
        print(f"\nthe {args.top} functions with the most bytecodes a request\n")
        print("".join(f"{name:>9}" for name in names) + "  function")
        for key in keys[: args.top]:
            path, function, line = key
            values = "".join(f"{per[name].get(key, 0.0):>9.1f}" for name in names)
            print(f"{values}  {function} ({path}:{line})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
