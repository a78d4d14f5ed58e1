"""fnrt serving the ``mlp`` example versus a bare Starlette endpoint, same run, same load.

    python bench/invoke.py [--connections 32] [--duration-s 8] [--rounds 3] [--plot FILE.png]

Both servers run on uvicorn with uvloop and httptools, one process each, with
``OMP_NUM_THREADS=1``; ``wrk`` (Debian package ``wrk``) drives them with the
same body at the same concurrency. Each configuration runs ``--rounds`` times,
interleaved so drift hits all alike; the median round is reported, and the
ratio fnrt / bare is the figure to read (absolute numbers move with the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import msgpack
import msgpack_numpy
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "{content_type}"
local f = io.open("{body}", "rb")
wrk.body = f:read("*all")
f:close()
"""


@dataclass(frozen=True)
class Result:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} not ready in {timeout_s}s")


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def wrk(url: str, script: Path, connections: int, duration_s: int) -> Result:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency", "-s", str(script), url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"\s50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"\s99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return Result(rps, p50, p99, int(errors.group(1)) if errors else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration-s", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plot", type=Path, help="write a bar chart of requests/s to this PNG")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk")

    work = Path(tempfile.mkdtemp(prefix="fnrt-bench-"))
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        example = work / "mlp"
        shutil.copytree(
            ROOT / "examples" / "mlp",
            example,
            ignore=shutil.ignore_patterns("*.safetensors", "__pycache__"),
        )
        weights = example / "weights.safetensors"
        subprocess.run(
            [sys.executable, str(example / "make_weights.py"), "--out", str(weights)],
            check=True,
            capture_output=True,
        )

        fnrt_port, bare_port = free_port(), free_port()
        procs.append(
            subprocess.Popen(
                [
                    str(BIN / "fnrt"),
                    "serve",
                    "--port",
                    str(fnrt_port),
                    "--store",
                    str(work / "store"),
                    "--cache-dir",
                    str(work / "cache"),
                    "--log-level",
                    "warning",
                ],
                env=env,
            )
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(ROOT / "bench" / "bare_app.py"), str(weights), str(bare_port)],
                env=env,
            )
        )
        wait_ready(f"http://127.0.0.1:{fnrt_port}/healthz", procs[0])
        subprocess.run(
            [
                str(BIN / "fnrt"),
                "deploy",
                str(example),
                "--server",
                f"http://127.0.0.1:{fnrt_port}",
                "--quiet",
            ],
            check=True,
            capture_output=True,
        )

        x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
        bodies = {
            "json": ("application/json", json.dumps({"x": x.tolist()}).encode()),
            "msgpack": (
                "application/msgpack",
                msgpack.packb({"x": x}, default=msgpack_numpy.encode),
            ),
        }
        scripts = {}
        for fmt, (ctype, body) in bodies.items():
            (work / f"{fmt}.body").write_bytes(body)
            scripts[fmt] = work / f"{fmt}.lua"
            scripts[fmt].write_text(LUA.format(content_type=ctype, body=work / f"{fmt}.body"))
        urls = {
            "fnrt": f"http://127.0.0.1:{fnrt_port}/v1/functions/mlp/invoke",
            "bare": f"http://127.0.0.1:{bare_port}/v1/functions/mlp/invoke",
        }
        for url in urls.values():  # warm up both (first invoke loads fnrt's instance)
            for fmt in bodies:
                wrk(url, scripts[fmt], args.connections, 1)

        results: dict[tuple[str, str], list[Result]] = {}
        for _ in range(args.rounds):
            for fmt in bodies:
                for name, url in urls.items():
                    results.setdefault((name, fmt), []).append(
                        wrk(url, scripts[fmt], args.connections, args.duration_s)
                    )

        def median(key: tuple[str, str]) -> Result:
            rounds = sorted(results[key], key=lambda r: r.rps)
            return rounds[len(rounds) // 2]

        print(
            f"\nmlp example, {args.connections} connections, "
            f"{args.duration_s}s x {args.rounds} rounds (median round)\n"
        )
        print(
            f"{'server':<6} {'format':<8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'non-2xx':>8}"
        )
        for fmt in bodies:
            for name in urls:
                r = median((name, fmt))
                print(
                    f"{name:<6} {fmt:<8} {r.rps:>9.0f} "
                    f"{r.p50_ms:>8.2f} {r.p99_ms:>8.2f} {r.errors:>8}"
                )
        print()
        for fmt in bodies:
            ratio = median(("fnrt", fmt)).rps / median(("bare", fmt)).rps
            spread = [
                round(a.rps / b.rps, 2)
                for a, b in zip(results[("fnrt", fmt)], results[("bare", fmt)], strict=True)
            ]
            print(f"fnrt / bare requests/s ({fmt}): {ratio:.2f}x   per round: {spread}")
        if args.plot:
            plot(results, median, args.plot)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def plot(results: dict[tuple[str, str], list[Result]], median: object, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fmts = sorted({f for _, f in results})
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, name in enumerate(("bare", "fnrt")):
        values = [statistics.median(r.rps for r in results[(name, f)]) for f in fmts]
        ax.bar([j + i * 0.38 for j in range(len(fmts))], values, width=0.38, label=name)
    ax.set_xticks([j + 0.19 for j in range(len(fmts))], fmts)
    ax.set_ylabel("requests/s")
    ax.set_title("mlp example: fnrt vs bare Starlette")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
