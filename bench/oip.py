"""The ``mlp`` example over the Open Inference Protocol (binary and JSON) versus ``/v1``.

    python bench/oip.py [--connections 32] [--duration-s 8] [--rounds 3] [--plot FILE.png]

One ``fnrt serve`` (uvicorn, uvloop, httptools, ``OMP_NUM_THREADS=1``) serves
``examples/mlp``; ``wrk`` sends the same single-row input four ways, in
interleaved rounds:

- ``v1-msgpack``: ``POST /v1/functions/mlp/invoke``, msgpack_numpy body (the baseline);
- ``v1-json``: the same route with a JSON body;
- ``oip-binary``: ``POST /v2/models/mlp/infer`` as tritonclient sends it by
  default (binary input, binary output asked for, no Content-Type);
- ``oip-json``: the same route with JSON ``data`` in and out.

Each figure is the median round; read the ratios against ``v1-msgpack``,
measured in the same run (absolute requests/s move with the machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import msgpack
import msgpack_numpy
import numpy as np
from loadgen import Result, deploy, mlp_server, report, require_wrk, write_script, wrk

BASELINE = "v1-msgpack"


def bodies(x: np.ndarray) -> dict[str, tuple[str, str | None, bytes, dict[str, str]]]:
    """name -> (path, Content-Type, body, other headers)."""
    invoke, infer = "/v1/functions/mlp/invoke", "/v2/models/mlp/infer"
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    as_json = json.dumps(
        {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.tolist()}]}
    ).encode()
    return {
        BASELINE: (
            invoke,
            "application/msgpack",
            msgpack.packb({"x": x}, default=msgpack_numpy.encode),
            {},
        ),
        "v1-json": (invoke, "application/json", json.dumps({"x": x.tolist()}).encode(), {}),
        "oip-binary": (
            infer,
            None,
            header + x.tobytes(),
            {"Inference-Header-Content-Length": str(len(header))},
        ),
        "oip-json": (infer, "application/json", as_json, {}),
    }


def check(url: str, body: bytes, headers: dict[str, str]) -> None:
    """One request by hand: the benchmark measures answers, not errors."""
    import httpx

    r = httpx.post(url, content=body, headers=headers, timeout=60)
    r.raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration-s", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plot", type=Path, help="write a bar chart of requests/s to this PNG")
    args = parser.parse_args()
    require_wrk()

    with mlp_server("fnrt-bench-oip-") as (work, example, server):
        deploy(server, example)
        x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
        scripts = {}
        for name, (path, ctype, body, headers) in bodies(x).items():
            wanted = headers | ({"content-type": ctype} if ctype else {})
            check(server + path, body, wanted)
            scripts[name] = (server + path, write_script(work, name, ctype, body, headers))
        for url, script in scripts.values():  # warm up
            wrk(url, script, args.connections, 1)

        results: dict[str, list[Result]] = {name: [] for name in scripts}
        for _ in range(args.rounds):
            for name, (url, script) in scripts.items():
                results[name].append(wrk(url, script, args.connections, args.duration_s))

        print(
            f"\nmlp example, {args.connections} connections, "
            f"{args.duration_s}s x {args.rounds} rounds (median round)\n"
        )
        report(results, BASELINE, "route")
        if args.plot:
            plot(results, args.plot)


def plot(results: dict[str, list[Result]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(names, [statistics.median(r.rps for r in results[n]) for n in names])
    ax.set_ylabel("requests/s")
    ax.set_title("mlp example: /v1 and the Open Inference Protocol")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
