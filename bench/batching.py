"""Batching off vs on vs adaptive on the ``wide-mlp`` example, against a bare endpoint and peers.

    python bench/batching.py [--connections 64] [--duration-s 8] [--rounds 3] [--no-peers]

Same run, same load (wrk, 64 connections), JSON and msgpack:

- fnrt with batching off (``max_batch_size = 1``), on (64, ``max_wait_ms = 2``)
  and adaptive (``target_p99_ms = 60``);
- a bare Starlette endpoint calling the model inline (no batching): the baseline;
- LitServe (``max_batch_size=16, batch_timeout=0.005``) and Ray Serve
  (``@serve.batch``), JSON only, from a separate venv this script makes under
  ``bench/.venv-peers`` (skipped if they do not install).

Every server runs with ``OMP_NUM_THREADS=1``. Prints requests/s, p50, p99 and
ratios; the median of the rounds, rounds interleaved.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgpack
import msgpack_numpy
import numpy as np
from loadgen import (
    Result,
    deploy,
    free_port,
    median,
    require_wrk,
    start_bare,
    start_fnrt,
    wait_ready,
    write_script,
    wrk,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "wide-mlp"
PEERS = ROOT / "bench" / ".venv-peers"

VARIANTS = {
    "fnrt-off": "[batching]\nmax_batch_size = 1\n",
    "fnrt-on": "[batching]\nmax_batch_size = 64\nmax_wait_ms = 2\n",
    "fnrt-adaptive": '[batching]\nmode = "adaptive"\ntarget_p99_ms = 60\nmax_batch_size = 64\n',
}
MAX_WAIT_MS = 2.0
FULL_BATCH = 64


def variant(work: Path, name: str, batching: str, weights: Path) -> Path:
    folder = work / name
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("*.safetensors", "__pycache__"))
    toml = (folder / "fnrt.toml").read_text()
    head, _, rest = toml.partition("[batching]")
    rest = rest[rest.index("[scaling]") :]
    toml = head.replace('name = "wide-mlp"', f'name = "{name}"') + batching + "\n" + rest
    (folder / "fnrt.toml").write_text(toml)
    shutil.copy(weights, folder / "weights.safetensors")
    return folder


def peers_python() -> Path | None:
    """The peer venv's python, made on first use; None when LitServe or Ray will not install."""
    python = PEERS / "bin" / "python"
    if not python.exists():
        print("making bench/.venv-peers (LitServe, Ray Serve) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PEERS)], check=True)
        done = subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "-c",
                str(ROOT / "constraints.txt"),
                "torch==2.13.0",
                "numpy",
                "safetensors",
                "litserve",
                "ray[serve]",
            ],
            check=False,
        )
        if done.returncode != 0:
            print("peers did not install; skipping LitServe and Ray Serve")
            return None
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--duration-s", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true", help="skip LitServe and Ray Serve")
    args = parser.parse_args()
    require_wrk()

    work = Path(tempfile.mkdtemp(prefix="fnrt-batching-"))
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        weights = work / "weights.safetensors"
        subprocess.run(
            [sys.executable, str(EXAMPLE / "make_weights.py"), "--out", str(weights)],
            check=True,
            capture_output=True,
        )
        fnrt, proc = start_fnrt(str(work / "store"), work / "cache", env)
        procs.append(proc)
        urls: dict[str, str] = {}
        for name, batching in VARIANTS.items():
            folder = variant(work, name, batching, weights)
            deploy(fnrt, folder)
            urls[name] = f"{fnrt}/v1/functions/{name}/invoke"

        urls["bare"], proc = start_bare(EXAMPLE, weights, env)
        procs.append(proc)

        x = np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)
        scripts = {
            "json": write_script(
                work, "json", "application/json", json.dumps({"x": x.tolist()}).encode()
            ),
            "msgpack": write_script(
                work,
                "msgpack",
                "application/msgpack",
                msgpack.packb({"x": x}, default=msgpack_numpy.encode),
            ),
        }
        runs = [(name, fmt) for fmt in scripts for name in urls]
        print("warming up ...", flush=True)
        for name, fmt in runs:
            wrk(urls[name], scripts[fmt], args.connections, 2)

        results: dict[tuple[str, str], list[Result]] = {}
        compute_ms: list[float] = []  # mean batch compute, as batches came
        full_ms: list[float] = []  # a full batch's compute, from the fitted cost model
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", flush=True)
            for name, fmt in runs:
                results.setdefault((name, fmt), []).append(
                    wrk(urls[name], scripts[fmt], args.connections, args.duration_s)
                )
                if name == "fnrt-on":
                    described = httpx.get(f"{fnrt}/v1/functions/fnrt-on").json()["instance"]
                    compute_ms.append(described["compute"]["mean_ms"])
                    model = described["cost_model"]
                    full_ms.append(model["per_item_ms"] * FULL_BATCH + model["fixed_ms"])
        # Peers one at a time, each paired with fnrt-on in the same rounds: a peer's
        # background processes (Ray's above all) must not slow the other runs.
        python = None if args.no_peers else peers_python()
        for peer, script in (("litserve", "litserve_app.py"), ("ray-serve", "ray_app.py")):
            if python is None:
                break
            with peer_server(python, script, weights, env) as url:
                if url is None:
                    print(f"{peer} did not start; skipping it")
                    continue
                print(f"{peer} ...", flush=True)
                wrk(url, scripts["json"], args.connections, 2)
                for _ in range(args.rounds):
                    for name, target in ((peer, url), (f"fnrt-on vs {peer}", urls["fnrt-on"])):
                        results.setdefault((name, "json"), []).append(
                            wrk(target, scripts["json"], args.connections, args.duration_s)
                        )
        report(results, runs, compute_ms, full_ms, fnrt, args)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def peer_server(
    python: Path, script: str, weights: Path, env: dict[str, str]
) -> Iterator[str | None]:
    """A peer serving the example from the peer venv; its URL, or None if it failed to start."""
    port = free_port()
    argv = [
        str(python),
        str(ROOT / "bench" / "peers" / script),
        str(EXAMPLE),
        str(weights),
        str(port),
    ]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        try:
            wait_ready(f"http://127.0.0.1:{port}/invoke", proc, timeout_s=180)
        except SystemExit:
            yield None
            return
        yield f"http://127.0.0.1:{port}/invoke"
    finally:
        # the peer's own workers too (LitServe spawns processes that outlive its parent)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        if script.startswith("ray"):  # the driver leaves Ray's daemons behind
            ray = python.parent / "ray"
            subprocess.run([str(ray), "stop", "--force"], capture_output=True, check=False)


def report(
    results: dict[tuple[str, str], list[Result]],
    runs: list[tuple[str, str]],
    compute_ms: list[float],
    full_ms: list[float],
    fnrt: str,
    args: argparse.Namespace,
) -> None:
    print(
        f"\nwide-mlp, {args.connections} connections, {args.duration_s}s x {args.rounds} rounds"
        " (median round)\n"
    )
    print(
        f"{'server':<14} {'format':<8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'non-2xx':>8}"
        f" {'x bare':>7} {'x off':>7}"
    )
    for name, fmt in runs:
        r = median(results[(name, fmt)])
        bare = median(results[("bare", fmt)]).rps
        off = median(results[("fnrt-off", fmt)]).rps
        print(
            f"{name:<14} {fmt:<8} {r.rps:>8.0f} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f} {r.errors:>8}"
            f" {r.rps / bare:>7.2f} {r.rps / off:>7.2f}"
        )
    print()
    for label, samples in (("mean batch", compute_ms), (f"full batch ({FULL_BATCH})", full_ms)):
        batch_ms = float(np.median(samples))
        bound = MAX_WAIT_MS + 3 * batch_ms
        for fmt in ("json", "msgpack"):
            p99 = median(results[("fnrt-on", fmt)]).p99_ms
            verdict = "within" if p99 <= bound else "OVER"
            print(
                f"fnrt-on p99 ({fmt}) {p99:.1f} ms: {verdict} max_wait_ms + 3 x {label} compute"
                f" = {MAX_WAIT_MS:.0f} + 3 x {batch_ms:.1f} = {bound:.1f} ms"
            )
    for peer in ("litserve", "ray-serve"):
        if (peer, "json") in results:
            theirs = median(results[(peer, "json")])
            ours = median(results[(f"fnrt-on vs {peer}", "json")])
            print(
                f"{peer:<10} json {theirs.rps:>8.0f} req/s, p50 {theirs.p50_ms:.1f} ms, "
                f"p99 {theirs.p99_ms:.1f} ms; fnrt-on in the same rounds {ours.rps:.0f} req/s: "
                f"fnrt-on / {peer} = {ours.rps / theirs.rps:.2f}x"
            )
    sizes = httpx.get(f"{fnrt}/v1/functions/fnrt-on").json()["instance"]["batch_sizes"]
    print(f"fnrt-on batch sizes (count by size): {sizes}")


if __name__ == "__main__":
    main()
