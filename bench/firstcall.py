"""Each example's first call right after its deploy, as ``make demo`` makes them, with its stages.

    python bench/firstcall.py [--examples DIR] [--rounds 1]

Starts ``fnrt serve`` (default settings: worker processes, one spare) on a new
store and cache, then for each example (``mlp``, ``mlp-onnx``, ``cnn-split``,
``tiny-lm``, in ``make demo``'s order) runs ``fnrt deploy`` and, as soon as it
returns, its first call (``sample.json``; ``tiny-lm``: a generate of one
token). Per example it prints the deploy's seconds, the first call's, the
stages its cold start recorded (``describe``'s ``last_load_timings_s``) and
their coverage: the stages' sum over the cold start's ``total_s``. The goal
(#45): no first call over 0.5 s.

``--examples`` names a folder holding copies of the examples with their
weights made (``make demo`` makes them in ``examples/``, the default).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from loadgen import BIN, ROOT, start_fnrt

EXAMPLES = ("mlp", "mlp-onnx", "cnn-split", "tiny-lm")
#: The stages of a cold start (``fetch_s`` and ``verify_s`` are parts of ``files_s``).
PARTS = ("fetch_s", "verify_s", "total_s")
GOAL_S = 0.5


def coverage(timings: dict[str, float]) -> float:
    """The recorded stages' sum over the cold start's total (1.0: they add up)."""
    total = timings.get("total_s", 0.0)
    stages = sum(v for k, v in timings.items() if k not in PARTS)
    return stages / total if total else 0.0


def first_call(http: httpx.Client, folder: Path, name: str) -> float:
    if name == "tiny-lm":
        body = {"prompt": ["The keeper"], "parameters": {"max_new_tokens": 1}}
        path = f"/v1/functions/{name}/generate"
    else:
        body = json.loads((folder / "sample.json").read_text())
        path = f"/v1/functions/{name}/invoke"
    start = time.perf_counter()
    r = http.post(path, json=body)
    elapsed = time.perf_counter() - start
    r.raise_for_status()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=Path, default=ROOT / "examples")
    parser.add_argument("--rounds", type=int, default=1, help="a new server each round")
    args = parser.parse_args()
    missing = [e for e in EXAMPLES if not any((args.examples / e).glob("*.safetensors"))]
    missing = [e for e in missing if not any((args.examples / e).glob("*.onnx"))]
    if missing:
        raise SystemExit(f"no weights in {args.examples} for {missing}: run make demo once")
    env = os.environ.copy()
    worst = 0.0
    for r in range(args.rounds):
        work = Path(tempfile.mkdtemp(prefix="fnrt-firstcall-"))
        url, proc = start_fnrt(str(work / "store"), work / "cache", env)
        http = httpx.Client(base_url=url, timeout=120)
        try:
            print(f"round {r + 1}/{args.rounds}")
            print(f"{'example':<10} {'deploy s':>8} {'first s':>8} {'cover':>6}  stages")
            for name in EXAMPLES:
                folder = args.examples / name
                start = time.perf_counter()
                argv = [str(BIN / "fnrt"), "deploy", str(folder), "--server", url, "-q"]
                done = subprocess.run(argv, capture_output=True, text=True)
                if done.returncode:
                    raise SystemExit(f"fnrt deploy {name}: {done.stderr.strip()}")
                deployed = time.perf_counter() - start
                elapsed = first_call(http, folder, name)
                worst = max(worst, elapsed)
                described = http.get(f"/v1/functions/{name}").json()["instance"]
                timings = described.get("last_load_timings_s") or {}
                stages = " ".join(f"{k.removesuffix('_s')}={v:.3f}" for k, v in timings.items())
                print(
                    f"{name:<10} {deployed:>8.3f} {elapsed:>8.3f} {coverage(timings):>6.0%}  "
                    f"{stages}",
                    flush=True,
                )
        finally:
            http.close()
            proc.terminate()
            proc.wait(30)
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nslowest first call: {worst:.3f} s (goal <= {GOAL_S} s)")


if __name__ == "__main__":
    main()
