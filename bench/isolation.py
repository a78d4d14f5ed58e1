"""Process isolation: what the hop to a worker costs, what a second core buys, what weights cost.

    python bench/isolation.py [--connections 32] [--duration-s 8] [--rounds 3] [--plot FILE.png]

1. The ``mlp`` example at ``--connections`` connections, deployed twice on one
   server: ``[isolation] mode = "thread"`` (the baseline) and ``"process"``.
   Batching amortises the hop to the worker; the goal is process >= 0.8x thread.
2. A CPU-bound pure-Python handler (the GIL holds it to one core in a thread)
   with 1 and 2 process instances, and 2 thread instances, against 1 process
   instance (the baseline). The goal on a 2-core machine is 2 processes >= 1.6x.
3. Two workers of a 256 MiB safetensors model: their PSS (from
   ``/proc/PID/smaps_rollup``) against the model's size. The weights are mapped
   from the disk cache, so the page cache holds one copy for both.

Variants run interleaved, ``--rounds`` times each (``wrk``, Debian package
``wrk``); the median round is reported and ratios are against the baseline
measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np
from loadgen import Result, copy_mlp, deploy, median, report, require_wrk, rounds, start_fnrt
from loadgen import write_script as wrk_script

SPIN_HANDLER = """
def handle(batch):
    out = []
    for r in batch:
        total = 0
        for i in range(600_000):  # pure Python: holds the GIL the whole time (~50 ms)
            total += i * i % 7
        out.append({"y": r["x"] + total % 2})
    return out
"""

SPIN_MANIFEST = """
name = "{name}"
handler = "handler:handle"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 4] }}

[batching]
max_batch_size = 1

[scaling]
min_instances = {instances}
max_instances = {instances}

[isolation]
mode = "{mode}"
"""

WEIGHTS_HANDLER = """
import numpy as np

class Weights:
    def load(self, artifacts, device):
        self.w = artifacts["weights"].arrays()["w"]
        self.total = float(self.w.sum(dtype=np.float64))  # touches every page

    def __call__(self, batch):
        return [{"y": np.full((1, 1), self.total, np.float32)} for _ in batch]
"""

WEIGHTS_MANIFEST = """
name = "big"
handler = "handler:Weights"

[artifacts]
weights = "weights.safetensors"

[outputs]
y = { dtype = "float32", shape = [-1, 1] }

[scaling]
min_instances = 2
max_instances = 2

[isolation]
mode = "process"
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration-s", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plot", type=Path, help="write a bar chart of the ratios to this PNG")
    parser.add_argument("--parts", default="1,2,3", help="which measurements to run (1,2,3)")
    args = parser.parse_args()
    require_wrk()
    work = Path(tempfile.mkdtemp(prefix="fnrt-bench-isolation-"))
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    server, proc = start_fnrt(str(work / "store"), work / "cache", env)
    parts = {int(p) for p in args.parts.split(",")}
    mlp: dict[str, list[Result]] = {}
    spin: dict[str, list[Result]] = {}
    pss_ratio = 0.0
    try:
        if 1 in parts:
            mlp = hop(server, work, args)
            print(f"\n== 1. mlp, {args.connections} connections: the hop to a worker process ==\n")
            report(mlp, "thread", "isolation")
        if 2 in parts:
            spin = cores(server, work, args)
            print("\n== 2. a CPU-bound Python handler, 8 connections: instances, 2 cores ==\n")
            report(spin, "process x1", "instances")
        if 3 in parts:
            pss_mib, size_mib = sharing(server, work)
            pss_ratio = pss_mib / size_mib
            print("\n== 3. two workers of one 256 MiB model ==\n")
            print(f"PSS of both workers: {pss_mib:.0f} MiB for a {size_mib:.0f} MiB model")
            print(f"ratio to one copy of the weights: {pss_ratio:.2f}x (unshared: over 2x)")
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    if args.plot and mlp and spin and pss_ratio:
        plot(mlp, spin, pss_ratio, args.plot)


def hop(server: str, work: Path, args: argparse.Namespace) -> dict[str, list[Result]]:
    example, _ = copy_mlp(work)
    manifest = (example / "fnrt.toml").read_text()
    urls = {}
    for mode in ("thread", "process"):
        folder = work / f"mlp-{mode}"
        shutil.copytree(example, folder)
        (folder / "fnrt.toml").write_text(
            manifest.replace('name = "mlp"', f'name = "mlp-{mode}"')
            + f'\n[isolation]\nmode = "{mode}"\n'
        )
        deploy(server, folder)
        urls[mode] = f"{server}/v1/functions/mlp-{mode}/invoke"
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    body = json.dumps({"x": x.tolist()}).encode()
    script = wrk_script(work, "mlp", "application/json", body)
    return rounds(urls, script, args.connections, args.duration_s, args.rounds)


def cores(server: str, work: Path, args: argparse.Namespace) -> dict[str, list[Result]]:
    urls = {}
    for label, mode, instances in (
        ("process x1", "process", 1),
        ("process x2", "process", 2),
        ("thread x2", "thread", 2),
    ):
        name = f"spin-{mode}-{instances}"
        folder = work / name
        folder.mkdir()
        (folder / "handler.py").write_text(textwrap.dedent(SPIN_HANDLER))
        (folder / "fnrt.toml").write_text(
            SPIN_MANIFEST.format(name=name, mode=mode, instances=instances)
        )
        deploy(server, folder)
        urls[label] = f"{server}/v1/functions/{name}/invoke"
    body = json.dumps({"x": [[1, 2, 3, 4]]}).encode()
    script = wrk_script(work, "spin", "application/json", body)
    return rounds(urls, script, 8, args.duration_s, args.rounds)


def sharing(server: str, work: Path) -> tuple[float, float]:
    """PSS (MiB) of the two workers of a 256 MiB model, and the model's size (MiB)."""
    from safetensors.numpy import save_file

    folder = work / "big"
    folder.mkdir()
    size = 256 << 20
    save_file({"w": np.ones(size // 4, np.float32)}, str(folder / "weights.safetensors"))
    (folder / "handler.py").write_text(textwrap.dedent(WEIGHTS_HANDLER))
    (folder / "fnrt.toml").write_text(WEIGHTS_MANIFEST)
    deploy(server, folder)
    request = urllib.request.Request(
        f"{server}/v1/functions/big/invoke",
        data=b'{"x": [[0]]}',  # any input: the model ignores it
        headers={"content-type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=120).read()
    workers: list[int] = []
    deadline = time.monotonic() + 60
    while len(workers) < 2 and time.monotonic() < deadline:  # the second starts by itself
        workers = _workers_of("big")
        time.sleep(0.2)
    if len(workers) < 2:
        sys.exit(f"expected two workers of 'big', found {workers}")
    time.sleep(1)  # let the second finish touching its pages
    pss = sum(_pss_bytes(pid) for pid in workers)
    return pss / 2**20, size / 2**20


def _workers_of(name: str) -> list[int]:
    """Worker processes whose arenas are in /dev/shm/fnrt-NAME-*."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if b"fnrt.loader.worker" not in cmdline:
                continue
            maps = (proc / "maps").read_text()
        except OSError:
            continue
        if f"/fnrt-{name}-" in maps:
            out.append(int(proc.name))
    return out


def _pss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def plot(
    mlp: dict[str, list[Result]], spin: dict[str, list[Result]], pss_ratio: float, path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def ratios(results: dict[str, list[Result]], base: str) -> dict[str, float]:
        b = median(results[base]).rps
        return {k: median(v).rps / b for k, v in results.items()}

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.5))
    for ax, (title, values, goal) in zip(
        axes,
        (
            ("mlp, 32 conn.: req/s vs thread", ratios(mlp, "thread"), 0.8),
            ("CPU-bound: req/s vs 1 process", ratios(spin, "process x1"), 1.6),
            ("256 MiB model: PSS of 2 workers", {"2 workers": pss_ratio}, 2.0),
        ),
        strict=True,
    ):
        ax.bar(list(values), list(values.values()))
        ax.axhline(goal, color="grey", linestyle="--", linewidth=1)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("x baseline" if "PSS" not in title else "x model size")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
