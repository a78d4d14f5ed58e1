"""What an async handler costs over a sync one: the ``mlp`` example both ways, one server.

    .venv/bin/python bench/async_handler.py [--duration-s 8] [--rounds 3]

The sync variant is ``examples/mlp`` as it is (the baseline); the async one is
the same class with ``async def __call__`` awaiting the same work, so the
difference is the instance's own event loop (a coroutine per batch, run to
completion on the loop the instance owns). Both run where the node puts them
(a worker process, the default). Measured with ``wrk`` at 1 connection (the
added latency, p50 and p99) and at 32 (throughput), variants interleaved,
``--rounds`` times each; ratios are against the sync variant in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from loadgen import copy_mlp, deploy, median, report, require_wrk, rounds, start_fnrt
from loadgen import write_script as wrk_script

ASYNC_HANDLER = """
from .handler import MLPHandler


class AsyncMLPHandler(MLPHandler):
    async def __call__(self, batch):
        return MLPHandler.__call__(self, batch)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    require_wrk()
    work = Path(tempfile.mkdtemp(prefix="fnrt-bench-async-"))
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    server, proc = start_fnrt(str(work / "store"), work / "cache", env)
    try:
        urls = _deploy_both(server, work)
        x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
        script = wrk_script(work, "mlp", "application/json", json.dumps({"x": x.tolist()}).encode())
        for connections in (1, 32):
            results = rounds(urls, script, connections, args.duration_s, args.rounds)
            print(f"\n== mlp, {connections} connection{'s' if connections > 1 else ''} ==\n")
            report(results, "sync", "handler")
            sync, other = median(results["sync"]), median(results["async"])
            print(
                f"async - sync: p50 {other.p50_ms - sync.p50_ms:+.3f} ms, "
                f"p99 {other.p99_ms - sync.p99_ms:+.3f} ms (median rounds)"
            )
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def _deploy_both(server: str, work: Path) -> dict[str, str]:
    example, _ = copy_mlp(work)
    manifest = (example / "fnrt.toml").read_text()
    folder = work / "mlp-async"
    shutil.copytree(example, folder)
    (folder / "async_handler.py").write_text(ASYNC_HANDLER)
    (folder / "fnrt.toml").write_text(
        manifest.replace('name = "mlp"', 'name = "mlp-async"').replace(
            'handler = "handler:MLPHandler"', 'handler = "async_handler:AsyncMLPHandler"'
        )
    )
    deploy(server, example)
    deploy(server, folder)
    return {
        "sync": f"{server}/v1/functions/mlp/invoke",
        "async": f"{server}/v1/functions/mlp-async/invoke",
    }


if __name__ == "__main__":
    main()
