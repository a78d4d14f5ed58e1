"""L2 wakes of fnrt at two or more revisions, interleaved in one run, against the floors.

    python bench/coldstart_ab.py --rev before=HEAD~1 --rev after=HEAD [--rounds 7] [--layers 16]

Each ``--rev NAME=REV`` is a git revision exported with ``git archive`` (``.``: the
working tree as it is), served by its own ``fnrt serve`` on its own folder store
(its processes, workers included, import fnrt from that export: ``PYTHONPATH``).
The model is ``bench/coldstart.py``'s (256 MiB of safetensors at 16 layers). Each
round wakes every server once from L2, in turn (the order reversed every other
round), each after ``SPARE_READY_S`` idle with its blob read into the page cache,
then measures the floor in this process and in a new one (``coldstart.py``'s).
Printed: each wake's medians and per-round ratios to both floors, and its recorded
stages. Timings on a shared machine only compare within one run; take it under
``flock /tmp/team/measure.lock``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from coldstart import (
    MODEL,
    ROOT,
    SPARE_READY_S,
    STAGES,  # the cold start's stages, as the loader records them
    Server,
    _digest_of,
    build_models,
    floor_in_process,
    fresh_floor,
    read_through,
)

PARTS = ("client", "edge", "functions", "loader", "runtime", "tracing")


def export(rev: str, work: Path, name: str) -> dict[str, str]:
    """The environment variables that make a process import fnrt at ``rev``."""
    if rev == ".":
        return {}
    tree, package = work / f"tree-{name}", work / f"pkg-{name}" / "fnrt"
    tree.mkdir()
    package.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    for part in PARTS:
        (package / part).symlink_to(tree / part)
    return {"PYTHONPATH": str(package.parent)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", action="append", required=True, help="NAME=REV (REV '.': as is)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--layers", type=int, default=16, help="16 layers = 256 MiB")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="fnrt-coldstart-ab-"))
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    servers: dict[str, tuple[Server, Path]] = {}
    try:
        wide, _, _ = build_models(work, args.layers)
        weights = wide / "weights.safetensors"
        sys.path.insert(0, str(MODEL))
        from net import WIDTH

        for spec in args.rev:
            name, _, rev = spec.partition("=")
            store = work / f"store-{name}"
            server = Server(work, name, str(store), env | export(rev or ".", work, name), None)
            server.deploy(wide)
            servers[name] = (server, store / "blobs" / "sha256" / _digest_of(weights))
        x = np.random.default_rng(1).standard_normal((1, WIDTH)).astype(np.float32)
        for server, _ in servers.values():  # first loads: imports, page cache
            server.cold_invoke("wide", x)
        buf = bytearray(16 << 20)
        wakes: dict[str, list[float]] = {name: [] for name in servers}
        stages: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
        floors: list[float] = []
        fresh: list[float] = []
        for r in range(args.rounds):
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            for name in order:
                server, blob = servers[name]
                read_through(blob, buf)
                time.sleep(SPARE_READY_S)  # its spare replaced and warm, as after idle time
                elapsed, timings, tier = server.cold_invoke("wide", x)
                assert tier == "l2", tier
                wakes[name].append(elapsed)
                stages[name].append(timings)
            read_through(weights, buf)
            fresh.append(fresh_floor(weights, args.layers, env))
            read_through(weights, buf)
            floors.append(floor_in_process(weights, args.layers, x))
            line = " ".join(f"{n} {wakes[n][-1] * 1e3:.1f}" for n in servers)
            print(
                f"round {r + 1}: {line}, floor {floors[-1] * 1e3:.1f}, "
                f"new-process floor {fresh[-1] * 1e3:.1f} (ms)",
                flush=True,
            )
        floor_s, fresh_s = statistics.median(floors), statistics.median(fresh)
        print(f"\nfloor {floor_s * 1e3:.1f} ms, in a new process {fresh_s * 1e3:.1f} ms (medians)")
        for name in servers:
            wake = statistics.median(wakes[name])
            each = [round(a / b, 2) for a, b in zip(wakes[name], floors, strict=True)]
            each_fresh = [round(a / b, 2) for a, b in zip(wakes[name], fresh, strict=True)]
            print(
                f"{name}: L2 wake {wake * 1e3:.1f} ms = {wake / floor_s:.2f}x the floor "
                f"{each}, {wake / fresh_s:.2f}x the new-process floor {each_fresh}"
            )
            parts = [
                f"{s[:-2]} {statistics.median(t.get(s, 0.0) for t in stages[name]) * 1e3:.1f}"
                for s in STAGES
            ]
            outside = statistics.median(
                a - t["total_s"] for a, t in zip(wakes[name], stages[name], strict=True)
            )
            print(
                f"  stages, medians in ms: {', '.join(parts)}; the call past total_s "
                f"{outside * 1e3:.1f}"
            )
    finally:
        for server, _ in servers.values():
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
