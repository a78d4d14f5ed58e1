"""The GPU path, measured against the plain ways, in one run (runs on the CPU too).

    python bench/gpu.py [--device auto|cpu|cuda] [--only pipeline,memory,load,sweep]
                        [--isolation process|thread] [--functions 8]
                        [--rounds 3] [--duration-s 4] [--load-gib 1.25] [--out FILE.json]
                        [--plot FILE.png]
    python bench/gpu.py --replot FILE.json [--plot FILE.png]

On a GPU machine, what #43 leaves to run (from the checkout, with its .venv; the onnx
extra's CPU onnxruntime and onnxruntime-gpu are one module, so the CPU one goes first):

    .venv/bin/pip install -c constraints.txt -e '.[torch,gpu,s3,dev]' \
      && .venv/bin/pip uninstall -y onnxruntime onnxruntime-gpu \
      && .venv/bin/pip install -c constraints.txt onnxruntime-gpu \
      && .venv/bin/python bench/gpu.py --device cuda --only pipeline,memory --out gpu.json \
      && .venv/bin/python -m pytest -m gpu -rs -p no:cacheprovider tests

Four parts, each printing its figures as ratios against a baseline measured in
the same run:

- **pipeline**: a batch-heavy MLP (each request 32 rows of 4,096 features on a
  GPU) served by a node through the real batcher, in worker processes by
  default (``--isolation``), under a closed loop of 128 clients. fnrt's staged
  path (a handler with ``forward``: pinned buffers, a copy and a compute
  stream, batch k+1 sent into the worker's second arena and staged there while
  batch k computes) against the same model in a plain ``__call__`` that stacks
  into pageable memory and runs on the default stream. Throughput and p99, the
  median of ``--rounds`` interleaved rounds after one round that warms both,
  and how many batches were sent ahead. On the CPU the same two handlers show
  what the overlap of stacking and compute is worth there.
- **memory**: ``--functions`` (8) functions loaded at once, one worker each:
  the node's GPU budget in use (tensors plus each worker's measured CUDA
  context and workspaces) against the device memory NVML counts as used since
  before the first worker started (the figure ``cudaMemGetInfo`` gives, read
  without a CUDA context in this process, which is not the workers'), and each
  worker's context. On the CPU: the budget's 0 and the host side.
- **load**: a ``--load-gib`` safetensors file from the disk cache into device
  memory: fnrt's parallel reads through a pinned ring
  (``loader/transfer.py``) against ``torch.load(...).to(device)``,
  ``safetensors.torch.load_file(device=...)`` and the file's raw read bandwidth
  (as many threads of ``pread`` into pageable memory), in GB/s; with the page
  cache dropped before each load (where this machine lets it be dropped: root),
  then with the file in the page cache.
- **sweep**: the wide-mlp example at 1, 2, 4 and 8 instances on the device
  (worker processes), 128 clients: throughput and p99 per level, and the level
  ``fnrt bench-concurrency`` would pick.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fnrt.runtime import scheduler as sched

ROOT = Path(__file__).resolve().parent.parent

PLAIN = '''
from contextlib import nullcontext
import numpy as np
import torch
from fnrt.functions import Handler
from .net import build


class Plain(Handler):
    """The baseline: stack into pageable memory, copy and compute on the default stream."""

    def load(self, artifacts, device):
        self.device = device.torch
        self.model = artifacts["weights"].module(build, device)

    def __call__(self, batch):
        sizes = [len(r["x"]) for r in batch]
        x = torch.from_numpy(np.concatenate([r["x"] for r in batch]))
        on_gpu = self.device != "cpu"
        default = nullcontext()
        if on_gpu:
            default = torch.cuda.stream(torch.cuda.default_stream(self.device))
        with torch.inference_mode(), default:
            y = self.model(x.to(self.device)).cpu().numpy()
        return [{"y": part} for part in np.split(y, np.cumsum(sizes)[:-1])]
'''

STAGED = """
from fnrt.functions import Handler
from .net import build


class Staged(Handler):
    \"\"\"fnrt stacks, copies (pinned, copy stream) and splits; forward runs on its stream.\"\"\"

    def load(self, artifacts, device):
        self.model = artifacts["weights"].module(build, device)

    def forward(self, inputs):
        return {"y": self.model(inputs["x"])}
"""

NET = """
from torch import nn

FEATURES = {features}
HIDDEN = {hidden}


def build():
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, 16),
    )
"""

MANIFEST = """
name = "{name}"
handler = "handler:{cls}"

[artifacts]
weights = "weights.safetensors"

[inputs]
x = {{ dtype = "float32", shape = [-1, {features}] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 16] }}

[batching]
max_batch_size = {batch}
max_wait_ms = 2

[scaling]
max_queue = 4096

[isolation]
mode = "{isolation}"
"""


def device_of(choice: str) -> Any:
    from fnrt.loader.device import detect_device

    return detect_device(choice)  # type: ignore[arg-type]


def make_node(tmp: Path, device: Any, isolation: str = "thread") -> Any:
    from fnrt.loader.instance import InstanceLoader
    from fnrt.loader.repository import Repository
    from fnrt.loader.stores.file import FileStore
    from fnrt.runtime.node import build_node
    from fnrt.runtime.settings import ServerSettings

    settings = ServerSettings(
        store=str(tmp / "store"),
        cache_dir=tmp / "cache",
        sweep_interval_s=3600,
        isolation=isolation,
    )
    repository = Repository(FileStore(tmp / "store"))
    loader = InstanceLoader(repository, tmp / "cache", device)
    return build_node(settings, loader=loader)


def publish(node: Any, folder: Path) -> Any:
    from fnrt.functions.bundle import pack
    from fnrt.functions.manifest import load_manifest
    from fnrt.functions.version import VersionManifest

    manifest = load_manifest(folder)
    bundle = pack(folder, manifest)
    for ref, source in bundle.blob_sources():
        node.repository.put_blob(ref.digest, source)
    return VersionManifest(manifest, bundle.code_ref, bundle.artifacts)


# --- pipeline ------------------------------------------------------------------------------


def write_model(
    root: Path,
    name: str,
    cls: str,
    handler: str,
    sizes: dict[str, int],
    isolation: str = "process",
) -> Path:
    import torch

    folder = root / name
    folder.mkdir(parents=True)
    (folder / "handler.py").write_text(textwrap.dedent(handler))
    (folder / "net.py").write_text(NET.format(**sizes))
    manifest = MANIFEST.format(name=name, cls=cls, isolation=isolation, **sizes)
    (folder / "fnrt.toml").write_text(manifest)
    namespace: dict[str, Any] = {}
    exec(NET.format(**sizes), namespace)  # the same network both sides, seeded
    torch.manual_seed(0)
    from fnrt.loader.formats.safetensors import save_arrays

    model = namespace["build"]()
    save_arrays(
        {k: v.detach().numpy() for k, v in model.state_dict().items()},
        folder / "weights.safetensors",
    )
    return folder


def pipeline(args: argparse.Namespace, device: Any, report: dict[str, Any]) -> None:
    from fnrt.runtime.concurrency import SweepConfig, measure, sample_request

    gpu = device.kind == "cuda"
    sizes = (
        {"features": 4096, "hidden": 4096, "batch": 32, "rows": 32}
        if gpu
        else {"features": 512, "hidden": 1024, "batch": 32, "rows": 8}
    )
    rows = sizes.pop("rows")
    tmp = Path(tempfile.mkdtemp(prefix="fnrt-bench-gpu-"))
    try:
        isolation = args.isolation
        folders = {
            "plain": write_model(tmp / "fns", "plain", "Plain", PLAIN, {**sizes}, isolation),
            "staged": write_model(tmp / "fns", "staged", "Staged", STAGED, {**sizes}, isolation),
        }
        node = make_node(tmp, device, isolation=isolation)
        config = SweepConfig(levels=(1,), clients=128, warmup_s=1.0, duration_s=args.duration_s)
        figures: dict[str, list[Any]] = {"plain": [], "staged": []}
        ahead = {"plain": 0, "staged": 0}  # batches sent into a worker's second arena

        async def run() -> None:
            vms = {k: publish(node, f) for k, f in folders.items()}
            request = sample_request(vms["plain"].manifest, rows=rows)
            factory = node.registry.schedulers
            for round_ in range(args.rounds + 1):  # the first warms both (CUDA, cuBLAS)
                for mode in ("plain", "staged"):
                    scheduler = factory(vms[mode])
                    try:
                        result = await measure(scheduler, 1, request, config)
                        for instance in scheduler.pool.loaded_instances():
                            ahead[mode] += getattr(instance, "sent_ahead", 0)
                    finally:
                        await sched.close(scheduler)
                    if round_:
                        figures[mode].append(result)

        asyncio.run(run())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rps = {m: statistics.median(r.throughput_rps for r in rs) for m, rs in figures.items()}
    p99 = {m: statistics.median(r.p99_ms for r in rs) for m, rs in figures.items()}
    errors = sum(r.errors for rs in figures.values() for r in rs)
    print(
        f"\npipeline on {device}, {args.isolation} isolation: {rows} rows x "
        f"{sizes['features']} float32 per request, batches of {sizes['batch']}, 128 clients, "
        f"median of {args.rounds} rounds"
    )
    print(f"  {'':32} {'requests/s':>12} {'p99 ms':>9}")
    print(f"  {'pageable + default stream':32} {rps['plain']:12.0f} {p99['plain']:9.2f}")
    print(f"  {'pinned + two streams, ahead':32} {rps['staged']:12.0f} {p99['staged']:9.2f}")
    print(
        f"  ratio: throughput {rps['staged'] / rps['plain']:.2f}x, "
        f"p99 {p99['staged'] / p99['plain']:.2f}x"
        f"  (errors: {errors})"
    )
    if args.isolation == "process":
        print(f"  batches sent ahead into a worker's second arena: {ahead}")
    report["pipeline"] = {
        "device": str(device),
        "isolation": args.isolation,
        "sent_ahead": ahead,
        "rows": rows,
        **sizes,
        "rounds": {m: [r.to_dict() for r in rs] for m, rs in figures.items()},
        "throughput_ratio": rps["staged"] / rps["plain"],
        "p99_ratio": p99["staged"] / p99["plain"],
    }


# --- memory --------------------------------------------------------------------------------


def nvml_used_bytes(device: Any) -> int | None:
    """Device memory in use, all processes (NVML: no CUDA context made here)."""
    if device.kind != "cuda":
        return None
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(device.index)
    return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)


def memory(args: argparse.Namespace, device: Any, report: dict[str, Any]) -> None:
    """``--functions`` functions loaded at once: the GPU budget against what the device
    says is used (within 5% is #43's bar), and each worker's measured context."""
    gpu = device.kind == "cuda"
    small = {"features": 64, "hidden": 128, "batch": 8}
    sizes = {"features": 1024, "hidden": 2048, "batch": 32} if gpu else small
    tmp = Path(tempfile.mkdtemp(prefix="fnrt-bench-memory-"))
    rows: list[dict[str, Any]] = []
    try:
        names = [f"fn{i}" for i in range(args.functions)]
        folders = [
            write_model(tmp / "fns", n, "Staged", STAGED, {**sizes}, args.isolation) for n in names
        ]
        node = make_node(tmp, device, isolation=args.isolation)
        before = nvml_used_bytes(device)  # before any worker touched the GPU

        async def run() -> int | None:
            vms = [publish(node, f) for f in folders]
            schedulers = [node.registry.schedulers(vm) for vm in vms]
            try:
                for s in schedulers:  # one at a time: where NVML cannot see a worker's pid
                    await sched.warm(s)  # (a container's pid namespace), it measures the
                for s in schedulers:  # device's free memory before and after its load
                    for instance in s.pool.loaded_instances():
                        rows.append(
                            {
                                "function": s.version.name,
                                "device": str(instance.device),
                                "device_bytes": instance.device_bytes,
                                "context_bytes": getattr(instance, "context_bytes", 0),
                                "host_bytes": instance.size_bytes,
                            }
                        )
                return nvml_used_bytes(device)  # all loaded
            finally:
                await asyncio.gather(*(sched.close(s) for s in schedulers))

        loaded = asyncio.run(run())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    budget = sum(r["device_bytes"] for r in rows)
    host = sum(r["host_bytes"] for r in rows)
    print(f"\nmemory on {device}, {args.isolation} isolation: {len(rows)} instances loaded")
    print(f"  {'function':10} {'device':8} {'device MiB':>11} {'context MiB':>12} {'host MiB':>9}")
    for r in rows:
        print(
            f"  {r['function']:10} {r['device']:8} {r['device_bytes'] / 2**20:11.1f} "
            f"{r['context_bytes'] / 2**20:12.1f} {r['host_bytes'] / 2**20:9.1f}"
        )
    print(f"  GPU budget in use: {budget / 2**20:.1f} MiB; host budget: {host / 2**20:.1f} MiB")
    entry: dict[str, Any] = {
        "device": str(device),
        "isolation": args.isolation,
        "instances": rows,
        "budget_bytes": budget,
        "host_bytes": host,
    }
    if before is not None and loaded is not None:
        used = loaded - before
        ratio = budget / used if used else float("nan")
        verdict = "within 5%" if abs(ratio - 1) <= 0.05 else "NOT within 5%"
        print(
            f"  device memory used since before the first worker (NVML, = cudaMemGetInfo's "
            f"total - free): {used / 2**20:.1f} MiB; budget / used = {ratio:.3f} ({verdict})"
        )
        entry |= {"device_used_bytes": used, "budget_over_used": ratio}
    report["memory"] = entry


# --- load ----------------------------------------------------------------------------------


def drop_caches() -> bool:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def parallel_read(
    path: Path, readers: int = 4, chunk: int = 32 << 20, out: np.ndarray[Any, Any] | None = None
) -> float:
    """Seconds to read the whole file with ``readers`` threads of pread into pageable memory
    (``out``, touched before: the time is the reads', not the page faults')."""
    size = path.stat().st_size
    out = np.empty(size, np.uint8) if out is None else out
    view = memoryview(out)
    fd = os.open(path, os.O_RDONLY)
    offsets = iter(range(0, size, chunk))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                at = next(offsets, None)
            if at is None:
                return
            part = view[at : min(at + chunk, size)]
            done = 0
            while done < len(part):
                done += os.preadv(fd, [part[done:]], at + done)

    start = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    os.close(fd)
    return seconds


def load(args: argparse.Namespace, device: Any, report: dict[str, Any]) -> None:
    import safetensors.torch
    import torch

    from fnrt.loader.formats.safetensors import save_arrays
    from fnrt.loader.transfer import TransferConfig, safetensors_to_device

    tmp = Path(tempfile.mkdtemp(prefix="fnrt-bench-load-"))
    target = device.torch
    sync: Callable[[], None] = torch.cuda.synchronize if device.kind == "cuda" else (lambda: None)
    try:
        tensor_bytes = 128 << 20
        count = max(1, round(args.load_gib * (1 << 30) / tensor_bytes))
        rng = np.random.default_rng(0)
        arrays = {
            f"layer{i}.weight": rng.standard_normal(tensor_bytes // 4, dtype=np.float32)
            for i in range(count)
        }
        st_path, pt_path = tmp / "model.safetensors", tmp / "model.pt"
        save_arrays(arrays, st_path)
        torch.save({k: torch.from_numpy(v) for k, v in arrays.items()}, pt_path)
        del arrays
        nbytes = st_path.stat().st_size

        def fnrt() -> Any:
            return safetensors_to_device(st_path, device)

        def torch_load() -> Any:
            return {k: v.to(target) for k, v in torch.load(pt_path).items()}

        def st_load() -> Any:
            return safetensors.torch.load_file(st_path, device=target)

        first = time.perf_counter()
        made = fnrt()
        sync()
        first_s = time.perf_counter() - first
        check = safetensors.torch.load_file(st_path, device="cpu")
        same = all(torch.equal(made[k].cpu(), check[k]) for k in check)
        del made, check
        readers = TransferConfig().readers
        raw_name = f"raw read ({readers} threads of pread)"
        into = np.ones(nbytes + 4096, np.uint8)  # pageable, touched: reads alone are timed
        methods: dict[str, Callable[[], Any]] = {
            raw_name: lambda: parallel_read(st_path, readers, out=into),
            "torch.load(...).to(device)": torch_load,
            "safetensors load_file(device=)": st_load,
            "fnrt: pread ring -> device": fnrt,
        }
        caches = ("dropped", "warm") if drop_caches() else ("warm",)
        seconds: dict[str, dict[str, list[float]]] = {c: {m: [] for m in methods} for c in caches}
        for cache in caches:
            for _ in range(args.rounds):
                for name, fn in methods.items():
                    if cache == "dropped":
                        drop_caches()
                    else:
                        parallel_read(st_path, readers, out=into)  # the file in the page cache
                    start = time.perf_counter()
                    out = fn()
                    sync()
                    seconds[cache][name].append(time.perf_counter() - start)
                    del out
                    if device.kind == "cuda":
                        torch.cuda.empty_cache()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report["load"] = {
        "device": str(device),
        "bytes": nbytes,
        "first_gb_per_s": nbytes / first_s / 1e9,
        "equal": same,
    }
    print(
        f"\nload of {nbytes / (1 << 30):.2f} GiB safetensors to {device}, median of "
        f"{args.rounds}; first load (its pinned ring allocated) {nbytes / first_s / 1e9:.2f} "
        f"GB/s; bytes equal: {same}"
    )
    for cache in caches:
        rates = {name: nbytes / statistics.median(s) / 1e9 for name, s in seconds[cache].items()}
        raw = rates[raw_name]
        baseline = rates["torch.load(...).to(device)"]
        ours = rates["fnrt: pread ring -> device"]
        print(f"  page cache {cache} before each load:")
        for name, rate in rates.items():
            print(f"    {name:34} {rate:7.2f} GB/s   {rate / baseline:5.2f}x torch.load")
        print(
            f"    fnrt: {ours / baseline:.2f}x torch.load(...).to(), {ours / raw:.2f}x the raw read"
        )
        report["load"][cache] = {
            "gb_per_s": rates,
            "vs_torch_load": ours / baseline,
            "vs_raw_read": ours / raw,
        }


# --- sweep ---------------------------------------------------------------------------------


def sweep(args: argparse.Namespace, device: Any, report: dict[str, Any]) -> None:
    from fnrt.runtime.concurrency import SweepConfig, best_level, sample_request
    from fnrt.runtime.concurrency import sweep as run_sweep

    tmp = Path(tempfile.mkdtemp(prefix="fnrt-bench-sweep-"))
    try:
        folder = tmp / "wide-mlp"
        shutil.copytree(
            ROOT / "examples" / "wide-mlp",
            folder,
            ignore=shutil.ignore_patterns("weights.*", "__pycache__"),
        )
        subprocess.run(
            [sys.executable, str(folder / "make_weights.py")], check=True, capture_output=True
        )
        node = make_node(tmp, device, isolation="process")
        levels = tuple(int(x) for x in args.levels.split(","))
        config = SweepConfig(levels=levels, clients=128, warmup_s=1.0, duration_s=args.duration_s)

        async def run() -> list[Any]:
            vm = publish(node, folder)
            request = sample_request(vm.manifest, rows=1)
            return await run_sweep(node.registry.schedulers, vm, request, config)

        results = asyncio.run(run())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    best = best_level(results)
    base = results[0].throughput_rps
    print(
        f"\nconcurrency sweep: wide-mlp on {device}, worker processes, 128 clients, "
        f"{args.duration_s} s a level"
    )
    print(
        f"  {'instances':>9} {'requests/s':>12} {'vs 1':>6} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'errors':>7}"
    )
    for r in results:
        print(
            f"  {r.level:9d} {r.throughput_rps:12.0f} {r.throughput_rps / base:5.2f}x "
            f"{r.p50_ms:8.2f} {r.p99_ms:8.2f} {r.errors:7d}"
        )
    print(f"  best: {best.level if best else 'none'} instances")
    report["sweep"] = {
        "device": str(device),
        "results": [r.to_dict() for r in results],
        "best": best.level if best else None,
    }


def plot(report: dict[str, Any], path: Path) -> None:
    """The figures people look at: loads in GB/s by method, the sweep's throughput and p99."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    load, sweep_ = report.get("load", {}), report.get("sweep", {})
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    caches = [c for c in ("dropped", "warm") if c in load]
    if caches:
        names = list(load[caches[0]]["gb_per_s"])
        width = 0.8 / len(caches)
        for i, cache in enumerate(caches):
            rates = [load[cache]["gb_per_s"][n] for n in names]
            label = "page cache dropped" if cache == "dropped" else "page cache warm"
            left.barh([y + i * width for y in range(len(names))], rates, width, label=label)
        left.set_yticks([y + width * (len(caches) - 1) / 2 for y in range(len(names))], names)
        left.set_xlabel("GB/s into device memory (raw read: into host memory)")
        left.set_title(f"{load['bytes'] / (1 << 30):.2f} GiB of safetensors to {load['device']}")
        left.legend(loc="lower right")
    results = sweep_.get("results") or []
    if results:
        levels = [r["level"] for r in results]
        right.plot(levels, [r["throughput_rps"] for r in results], "o-", label="requests/s")
        right.set_xscale("log", base=2)
        right.set_xticks(levels, [str(x) for x in levels])
        right.set_xlabel("instances on the device")
        right.set_ylabel("requests/s")
        right.set_ylim(bottom=0)
        p99 = right.twinx()
        p99.plot(levels, [r["p99_ms"] for r in results], "s--", color="tab:red", label="p99")
        p99.set_ylabel("p99 ms", color="tab:red")
        p99.set_ylim(bottom=0)
        right.set_title(f"wide-mlp on {sweep_['device']}: best {sweep_.get('best')} instances")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plotted {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--only", default="pipeline,memory,load,sweep")
    parser.add_argument("--isolation", default="process", choices=["process", "thread"])
    parser.add_argument("--functions", type=int, default=8, help="memory: functions loaded")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=4.0)
    parser.add_argument("--load-gib", type=float, default=1.25)
    parser.add_argument("--levels", default="1,2,4,8")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="plot the load and the sweep")
    parser.add_argument(
        "--replot", type=Path, metavar="JSON", help="plot a saved --out, run nothing"
    )
    args = parser.parse_args()
    if args.replot:
        plot(json.loads(args.replot.read_text()), args.plot or args.replot.with_suffix(".png"))
        return
    device = device_of(args.device)
    report: dict[str, Any] = {}
    parts = {"pipeline": pipeline, "memory": memory, "load": load, "sweep": sweep}
    for name in args.only.split(","):
        started = time.perf_counter()
        try:
            parts[name](args, device, report)
        except Exception as exc:  # one part failing leaves the others' figures
            import traceback

            traceback.print_exc()
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"  ({name}: {time.perf_counter() - started:.0f} s)", flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    if args.plot:
        plot(report, args.plot)


if __name__ == "__main__":
    main()
