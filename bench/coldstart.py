"""Cold starts from each tier, against the plain ways of loading the same bytes, in one run.

    python bench/coldstart.py [--rounds 3] [--layers 16] [--isolation thread] [--plot FILE.png]

A wide MLP with 256 MiB of float32 weights (safetensors) and an ONNX model
are deployed to two fnrt servers: one on a local store, one on an S3 endpoint
(moto's server in its own process on 127.0.0.1). Measured, median of rounds:

- L2 wake (file in the page cache) -> first response, after 4 s idle (time for the
  spare worker to be ready, as after a keep-alive), versus the floor
  (``safetensors.torch.load_file``, a mmap, into a module built on the
  ``meta`` device, and its first forward, in this process) and versus the
  baseline ``torch.load`` (no mmap) + ``load_state_dict`` + one forward, on a
  model built before the clock starts; and, for reading process isolation's
  figure, the same floor in a new process whose imports are done before the
  clock, as a spare worker's are (``FRESH_FLOOR``);
- L3 wake (empty disk cache) and its fetch, versus boto3's ``download_file``
  of the same object from the same endpoint, with its default settings and
  with a tuned ``TransferConfig`` (16 threads, 16 MiB parts);
- the raw read throughput of the cached file (what the L2 path approaches);
- once each, a node's first cold start of the model: right after its deploy to
  that node (the torch model, and its ONNX export under onnxruntime: the call made
  as soon as the deploy answers, which is once a worker is ready for it; against
  the same function's L2 wake after idle time, goal <= 1.5x), on a new node
  started on the store the model is deployed to (a new cache: nothing learned
  there), and on such a node with ``--spare-workers 0``
  (every cold start starts a Python and imports torch). Each waits 4 s first, as
  a node started ahead of its traffic would: a node learns what the model's code
  imports at its deploy (``loader/imports.py``), and its spare worker imports it;
- the same model with an ``[environment]`` of its own (``humanize``, from the
  package index: skipped when it cannot be built): its first cold start after
  its deploy, and in every round after 4 s idle an L2 wake, each taking a spare
  of its environment's own.

Each fnrt cold start's row also gives its stages' coverage: the sum of the
stages it recorded over its ``total_s`` (goal >= 95%, #45), and ``total_s``
over the whole call as the client saw it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
from loadgen import deploy, start_fnrt, start_moto

from fnrt.loader.instance import STAGES, stage_sum

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "bench" / "coldstart_model"
MiB = 1024 * 1024
FRESH_FLOOR_LABEL = "floor in a new process (imports done before the clock)"
JSON = {"content-type": "application/json"}
ENV_WAKE_LABEL = "fnrt L2 wake in an [environment] (its spare)"
#: Idle time before an L2 wake, for the spare worker to be started (a second after
#: the last cold start) and finish its imports (torch's take about a second here).
SPARE_READY_S = 4.0


#: The floor again, in a new process whose imports are done before the clock starts,
#: as a worker's are (run as ``python -c FRESH_FLOOR MODEL_DIR WEIGHTS LAYERS``; it
#: prints the seconds): whether this process's floor, after rounds of forwards of the
#: same shapes, is flattered by them, and how much of process isolation's figure a new
#: process explains. (Measured: not at all; 0.022 s both, 7 rounds.) The goal stays
#: against the floor in this process.
FRESH_FLOOR = """
import sys, time
import numpy as np, torch
from safetensors.torch import load_file
sys.path.insert(0, sys.argv[1])
from net import WIDTH, build
x = torch.from_numpy(np.random.default_rng(1).standard_normal((1, WIDTH)).astype(np.float32))
start = time.perf_counter()
with torch.device("meta"):
    net = build(WIDTH, int(sys.argv[3]))
net.load_state_dict(load_file(sys.argv[2]), assign=True)
with torch.inference_mode():
    net(x)
print(time.perf_counter() - start)
"""


def environment_copy(wide: Path, folder: Path) -> Path:
    """The model as a function with an ``[environment]`` of its own (one small package
    the server lacks): its workers run with that folder first on their path."""
    shutil.copytree(wide, folder)
    manifest = (wide / "fnrt.toml").read_text().replace('name = "wide"', 'name = "wide-env"')
    (folder / "fnrt.toml").write_text(
        manifest + '\n[environment]\nrequirements = ["humanize==4.9.0"]\n'
    )
    return folder


def fresh_floor(weights: Path, layers: int, env: dict[str, str]) -> float:
    argv = [sys.executable, "-c", FRESH_FLOOR, str(MODEL), str(weights), str(layers)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return float(done.stdout)


def coverage(timings: dict[str, float], elapsed_s: float) -> tuple[float, float]:
    """(the stages' sum over ``total_s``, ``total_s`` over the call's ``elapsed_s``)."""
    total = timings.get("total_s", 0.0)
    return (stage_sum(timings) / total if total else 0.0, total / elapsed_s)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def read_through(path: Path, buf: bytearray) -> None:
    """Read ``path`` to its end in pieces of ``buf`` (it is in the page cache after)."""
    with path.open("rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def floor_in_process(weights: Path, layers: int, x: np.ndarray) -> float:
    """The floor in this process: seconds to build the model on the meta device, assign
    it the weights mapped from ``weights`` and run one forward of ``x``; the imports
    are done before the clock, as ``FRESH_FLOOR``'s (``MODEL`` on ``sys.path``)."""
    import torch
    from net import WIDTH, build
    from safetensors.torch import load_file

    def floor() -> None:
        with torch.device("meta"):
            net = build(WIDTH, layers)
        net.load_state_dict(load_file(weights), assign=True)
        with torch.inference_mode():
            net(torch.from_numpy(x))

    return timed(floor)


def build_models(work: Path, layers: int) -> tuple[Path, Path, Path]:
    """The safetensors function folder, a torch checkpoint of the same weights, the ONNX folder."""
    import torch

    sys.path.insert(0, str(MODEL))
    from net import WIDTH, build

    from fnrt.loader.formats.safetensors import save_arrays

    wide = work / "wide"
    shutil.copytree(MODEL, wide, ignore=shutil.ignore_patterns("onnx_handler.py", "__pycache__"))
    (wide / "net.py").write_text(
        (MODEL / "net.py").read_text().replace("LAYERS = 16", f"LAYERS = {layers}")
    )
    rng = np.random.default_rng(0)
    arrays = {}
    for i in range(layers):
        arrays[f"{2 * i}.weight"] = rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) * 0.02
        arrays[f"{2 * i}.bias"] = np.zeros(WIDTH, np.float32)
    save_arrays(arrays, wide / "weights.safetensors")
    checkpoint = work / "weights.pt"
    torch.save({k: torch.from_numpy(v) for k, v in arrays.items()}, checkpoint)

    onnx_dir = work / "wide-onnx"
    onnx_dir.mkdir()
    (onnx_dir / "handler.py").write_text((MODEL / "onnx_handler.py").read_text())
    (onnx_dir / "fnrt.toml").write_text(
        'name = "wide-onnx"\nhandler = "handler:WideOnnx"\n\n[artifacts]\nmodel = "model.onnx"\n'
        '\n[inputs]\nx = { dtype = "float32", shape = [1, 2048] }\n'
    )
    net = build(WIDTH, max(layers // 4, 1)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (torch.zeros(1, WIDTH),),
            str(onnx_dir / "model.onnx"),
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
        )
    return wide, checkpoint, onnx_dir


class Server:
    def __init__(
        self,
        work: Path,
        name: str,
        store: str,
        env: dict[str, str],
        s3_endpoint: str | None,
        isolation: str | None = None,
        *more: str,
    ) -> None:
        self.cache = work / f"cache-{name}"
        extra = ("--s3-endpoint", s3_endpoint) if s3_endpoint else ()
        if isolation:
            extra += ("--isolation", isolation)
        extra += tuple(more)
        self.url, self.proc = start_fnrt(store, self.cache, env, *extra)
        self.http = httpx.Client(base_url=self.url, timeout=600)

    def deploy(self, folder: Path) -> None:
        deploy(self.url, folder)

    def cold_invoke(self, name: str, x: np.ndarray) -> tuple[float, dict[str, float], str]:
        assert self.http.post(f"/v1/functions/{name}/unload").status_code == 200
        body = json.dumps({"x": x.tolist()})  # the client's own work: before the clock
        start = time.perf_counter()
        r = self.http.post(f"/v1/functions/{name}/invoke", content=body, headers=JSON)
        elapsed = time.perf_counter() - start
        r.raise_for_status()
        timings = self.http.get(f"/v1/functions/{name}").json()["instance"]["last_load_timings_s"]
        return elapsed, timings, r.headers.get("x-fnrt-cold-start", "")

    def states(self) -> dict[str, str]:
        """Each deployed function's state here (cold, loading, warm)."""
        listed = self.http.get("/v1/functions", params={"limit": 1000}).json()["functions"]
        return {f["name"]: f["state"] for f in listed}

    def drop_blobs(self) -> None:
        """Empty the disk cache (L2) for an L3 wake, with no instance of any function
        loaded: a blob removed under a live instance is a changed file to the scrub,
        which retires that instance and loads it again from the store (the blob back in
        L2, maybe after the drop; a reload racing the next drop fails its load and backs
        off). Each function is unloaded first, and found cold after."""
        for name, state in self.states().items():
            if state != "cold":
                assert self.http.post(f"/v1/functions/{name}/unload").status_code == 200
        loaded = {name: state for name, state in self.states().items() if state != "cold"}
        assert not loaded, f"still loaded before the blobs are dropped: {loaded}"
        for path in (self.cache / "blobs").iterdir():
            path.unlink()

    def stop(self) -> None:
        self.http.close()
        self.proc.terminate()
        self.proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=16, help="16 layers = 256 MiB")
    parser.add_argument(
        "--isolation",
        choices=["process", "thread"],
        help="the servers' --isolation (default: theirs, process: a cold start includes a "
        "worker's)",
    )
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()

    import boto3
    import torch
    from boto3.s3.transfer import TransferConfig

    work = Path(tempfile.mkdtemp(prefix="fnrt-coldstart-"))
    env = os.environ | {
        "OMP_NUM_THREADS": "1",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    os.environ.update(
        {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    )
    torch.set_num_threads(1)
    procs: list[subprocess.Popen[bytes]] = []
    servers: list[Server] = []
    try:
        print("building models ...", flush=True)
        wide, checkpoint, onnx_dir = build_models(work, args.layers)
        weights = wide / "weights.safetensors"
        size = weights.stat().st_size
        onnx_mib = (onnx_dir / "model.onnx").stat().st_size / MiB
        print(f"safetensors {size / MiB:.0f} MiB, onnx {onnx_mib:.0f} MiB")

        endpoint, moto = start_moto(env)
        procs.append(moto)
        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="bench")

        local = Server(work, "file", str(work / "store"), env, None, args.isolation)
        remote = Server(work, "s3", "s3://bench/fns", env, endpoint, args.isolation)
        servers += [local, remote]
        remote.deploy(wide)
        remote.deploy(onnx_dir)
        in_environment = environment_copy(wide, work / "wide-env")
        try:
            local.deploy(in_environment)
        except subprocess.CalledProcessError as exc:
            print(f"skipping the [environment] rows: {exc.stderr.decode().strip()}")
            in_environment = None
        x = np.random.default_rng(1).standard_normal((1, 2048)).astype(np.float32)
        firsts = {}  # label -> (seconds, of which the weights' sha256: once per node)
        first_stages: dict[str, dict[str, float]] = {}  # label -> its load's timings
        covers: dict[str, list[tuple[float, float]]] = {}  # label -> coverages, per round
        # right after each deploy: the deploy answers once a worker is ready for it
        local.deploy(wide)
        elapsed, t, _ = local.cold_invoke("wide", x)
        firsts["right after its deploy"] = (elapsed, t["verify_s"])
        first_stages["right after its deploy"] = t
        covers["fnrt first cold start right after its deploy"] = [coverage(t, elapsed)]
        local.deploy(onnx_dir)
        elapsed, t, _ = local.cold_invoke("wide-onnx", x)
        firsts["onnxruntime, right after its deploy"] = (elapsed, t["verify_s"])
        first_stages["onnxruntime, right after its deploy"] = t
        label = "fnrt first cold start onnxruntime, right after its deploy"
        covers[label] = [coverage(t, elapsed)]
        if in_environment is not None:
            time.sleep(SPARE_READY_S)
            elapsed, t, _ = local.cold_invoke("wide-env", x)
            firsts["in an [environment] after its deploy"] = (elapsed, t["verify_s"])
            first_stages["in an [environment] after its deploy"] = t
            covers["fnrt first cold start in an [environment] after its deploy"] = [
                coverage(t, elapsed)
            ]
        for label, name, more in (
            ("of a new node on the store", "new", ()),
            ("of a new node, --spare-workers 0", "no-spare", ("--spare-workers", "0")),
        ):
            new = Server(work, name, str(work / "store"), env, None, args.isolation, *more)
            time.sleep(SPARE_READY_S)  # started ahead of its traffic
            elapsed, t, _ = new.cold_invoke("wide", x)
            firsts[label] = (elapsed, t["verify_s"])
            first_stages[label] = t
            covers[f"fnrt first cold start {label}"] = [coverage(t, elapsed)]
            new.stop()  # and its workers with it, before anything else is measured
        for server in servers:  # first loads: imports, page cache
            for name in ("wide", "wide-onnx"):
                if server is not local:  # the local node's came after their deploys
                    server.cold_invoke(name, x)

        from fnrt.loader.repository import blob_key

        sys.path.insert(0, str(MODEL))
        from net import WIDTH, build

        model = build(WIDTH, args.layers).eval()
        key = "fns/" + blob_key(_digest_of(weights))

        rows: dict[str, list[float]] = {}

        def add(label: str, seconds: float) -> None:
            rows.setdefault(label, []).append(seconds)

        def wake(server: Server, name: str, tier: str, label: str) -> dict[str, float]:
            """A cold start of ``name`` that loads from ``tier``: the call's seconds in
            ``label``'s row, its stages' coverage kept; its stages."""
            elapsed, t, found = server.cold_invoke(name, x)
            assert found == tier, found
            add(label, elapsed)
            covers.setdefault(label, []).append(coverage(t, elapsed))
            return t

        buf = bytearray(16 * MiB)
        # a folder store's blobs are mapped in place: fnrt's copy of the weights
        cached = work / "store" / "blobs" / "sha256" / _digest_of(weights)

        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", flush=True)
            # L2: the file is on local disk and in the page cache, as the floor's file is
            # (the last round's downloads may have pushed either out)
            read_through(cached, buf)
            # a cold start comes after idle time: the spare worker the last one took has
            # been replaced, its imports done (back to back, a cold start waits for them)
            time.sleep(SPARE_READY_S)
            read_through(weights, buf)
            add(FRESH_FLOOR_LABEL, fresh_floor(weights, args.layers, env))
            t = wake(local, "wide", "l2", "fnrt L2 wake -> first response")
            add("fnrt L2 wake: handler import", t["import_s"])
            add("fnrt L2 wake: handler load (map)", t["load_s"])
            add("fnrt L2 wake: content check (xxh3, every load)", t["verify_s"])

            def baseline() -> None:
                sd = torch.load(checkpoint, mmap=False, weights_only=True)
                model.load_state_dict(sd)
                with torch.inference_mode():
                    model(torch.from_numpy(x))

            add("baseline torch.load + load_state_dict + forward", timed(baseline))

            read_through(weights, buf)
            floor = floor_in_process(weights, args.layers, x)
            add("floor: safetensors mmap + meta module + forward", floor)

            # L3: an empty disk cache, fetched from the S3 endpoint
            remote.drop_blobs()
            t = wake(remote, "wide", "l3", "fnrt L3 wake -> first response")
            add("fnrt L3 fetch (parallel ranged GETs)", t["fetch_s"])
            add("fnrt L3 verify (sha256)", t["verify_s"])
            dest = str(work / "download_file.bin")
            add(
                "baseline boto3 download_file",
                timed(lambda dest=dest: s3.download_file("bench", key, dest)),
            )
            os.unlink(dest)
            tuned = TransferConfig(max_concurrency=16, multipart_chunksize=16 * MiB)
            add(
                "baseline boto3 download_file, tuned",
                timed(lambda d=dest, c=tuned: s3.download_file("bench", key, d, Config=c)),
            )
            os.unlink(dest)

            add("raw read of the cached file", timed(lambda: read_through(weights, buf)))

            # after idle time too, as the torch model's: its spare replaced (with none
            # ready, a wake waits for the one still importing: seconds on two cores)
            time.sleep(SPARE_READY_S)
            wake(local, "wide-onnx", "l2", "onnx: fnrt L2 wake -> first response")
            remote.drop_blobs()  # its spare: ready by now
            wake(remote, "wide-onnx", "l3", "onnx: fnrt L3 wake -> first response")

            if in_environment is not None:  # its spare, started after the last one
                time.sleep(SPARE_READY_S)
                read_through(cached, buf)
                wake(local, "wide-env", "l2", ENV_WAKE_LABEL)

        for label, (seconds, verify_s) in firsts.items():
            rows[f"fnrt first cold start {label}"] = [seconds]
            rows[f"  {label}: the weights' sha256"] = [verify_s]  # once a node
        med = {label: statistics.median(v) for label, v in rows.items()}
        print(f"\n{'':<62} {'median s':>9}  (rounds: {args.rounds}, weights {size / MiB:.0f} MiB)")
        for label, value in med.items():
            each = " ".join(f"{v:.3f}" for v in rows[label]) if len(rows[label]) > 1 else ""
            print(f"{label:<62} {value:>9.3f}  {each}")
        print("\nstages' coverage of each cold start: their sum / total_s (goal >= 95%),")
        print("and total_s / the whole call as the client saw it; the lowest of the rounds")
        for label, pairs in covers.items():
            stages, call = min(p[0] for p in pairs), min(p[1] for p in pairs)
            print(f"{label:<62} {stages:>6.1%} {call:>7.1%}")
        print("\nwhere each first cold start's time went (its stages, seconds)")
        for label, t in first_stages.items():
            spent = [f"{k.removesuffix('_s')}={t[k]:.3f}" for k in STAGES if t.get(k, 0) >= 5e-4]
            print(f"{label:<42} {' '.join(spent)}")
        print()
        for what, first, idle in (
            ("torch", "right after its deploy", "fnrt L2 wake -> first response"),
            (
                "onnxruntime",
                "onnxruntime, right after its deploy",
                "onnx: fnrt L2 wake -> first response",
            ),
        ):
            ratio = firsts[first][0] / med[idle]
            print(f"first call right after its deploy / L2 wake after idle, {what}: {ratio:.2f}x")
        print("  (goal <= 1.5x)")
        l2 = med["fnrt L2 wake -> first response"]
        base = med["baseline torch.load + load_state_dict + forward"]
        fetch = med["fnrt L3 fetch (parallel ranged GETs)"]
        download = med["baseline boto3 download_file"]
        read = med["raw read of the cached file"]
        floor_label = "floor: safetensors mmap + meta module + forward"
        floor_s = med[floor_label]
        tuned_s = med["baseline boto3 download_file, tuned"]
        print(f"L2 wake / floor (goal <= 1.3x):             {l2 / floor_s:.2f}x")
        per_round = zip(rows["fnrt L2 wake -> first response"], rows[floor_label], strict=True)
        print(f"  per round: {[round(a / b, 2) for a, b in per_round]}")
        fresh = rows[FRESH_FLOOR_LABEL]
        print(f"L2 wake / floor in a new process:           {l2 / med[FRESH_FLOOR_LABEL]:.2f}x")
        per_round = zip(rows["fnrt L2 wake -> first response"], fresh, strict=True)
        print(f"  per round: {[round(a / b, 2) for a, b in per_round]}")
        if ENV_WAKE_LABEL in med:
            print(
                f"L2 wake in an [environment] / floor:        {med[ENV_WAKE_LABEL] / floor_s:.2f}x"
            )
        print(f"L2 wake speed-up over torch.load baseline:  {base / l2:.1f}x")
        print(f"L3 fetch speed vs boto3 download_file:      {download / fetch:.2f}x")
        print(f"L3 fetch speed vs boto3, tuned:             {tuned_s / fetch:.2f}x")
        print(f"raw read throughput of the cached file:     {size / read / 1e9:.2f} GB/s")
        print(f"L2 wake effective throughput:               {size / l2 / 1e9:.2f} GB/s")
        check = med["fnrt L2 wake: content check (xxh3, every load)"]
        print(f"content check at every load, share of L2 wake: {check / l2:.0%}")
        if args.plot:
            plot(med, args.plot)
    except BaseException:
        for log in sorted(work.glob("fnrt-*.log")):  # the servers' own words, before they go
            lines = log.read_text(errors="replace").splitlines()
            print(f"--- {log.name} (last 40 lines)\n" + "\n".join(lines[-40:]), file=sys.stderr)
        raise
    finally:
        for server in servers:
            server.stop()
        for proc in procs:
            proc.terminate()
            proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def _digest_of(path: Path) -> str:
    from fnrt.functions.bundle import file_digest

    return file_digest(path)


def plot(med: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [k for k in med if not k.startswith("onnx")]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.barh(labels, [med[k] for k in labels])
    ax.invert_yaxis()
    ax.set_xlabel("seconds (median)")
    ax.set_title("cold start by tier, 256 MiB model")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
