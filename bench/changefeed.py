"""Store requests per minute of one idle node, at 10 and at 1,000 deployed functions.

    python bench/changefeed.py [--functions 10 1000] [--window-s 30] [--change-every-s 5]

For each count, a real ``fnrt serve`` node watches an S3 store (moto's server
on 127.0.0.1) holding that many functions, every one of which it read at
start, polling every second (the default). Another writer changes one
function's routing every ``--change-every-s`` seconds, as deploys elsewhere
in a fleet would. The node's own ``fnrt_store_requests_total`` (every HTTP
request boto3 sends, counted by botocore's ``before-send`` event) is read
before and after the window. Prints requests per minute by operation and the
ratio of each count's total to the first's (the goal: 1.0x).
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
from loadgen import start_fnrt, start_moto, wait_ready

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}
HANDLER = """
class Echo:
    def load(self, artifacts, device):
        pass

    def __call__(self, batch):
        return batch
"""


def populate(store_uri: str, endpoint: str, count: int, work: Path) -> list[tuple[str, str]]:
    """``count`` functions f0..f{count-1} in the store; (name, version) of each."""
    from fnrt.functions.bundle import pack
    from fnrt.functions.manifest import load_manifest
    from fnrt.functions.routing import Routing
    from fnrt.functions.version import VersionManifest
    from fnrt.loader.repository import Repository
    from fnrt.loader.stores import open_store
    from fnrt.loader.stores.s3 import S3Config

    folder = work / "echo"
    folder.mkdir(exist_ok=True)
    (folder / "handler.py").write_text(textwrap.dedent(HANDLER))
    (folder / "fnrt.toml").write_text('name = "echo"\nhandler = "handler:Echo"\n')
    repository = Repository(open_store(store_uri, S3Config(endpoint_url=endpoint)))
    deployed = []
    for i in range(count):
        manifest = load_manifest(folder, name=f"f{i}")
        bundle = pack(folder, manifest)
        vm = VersionManifest(manifest, bundle.code_ref, bundle.artifacts)
        if i == 0:
            for ref, source in bundle.blob_sources():
                repository.put_blob(ref.digest, source)
        repository.put_version(vm)
        repository.update_routing(vm.name, lambda _, v=vm.version: Routing({v: 100}))
        deployed.append((vm.name, vm.version))
    return deployed


def store_requests(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    pattern = r'^fnrt_store_requests_total\{operation="(\w+)"\} ([0-9.e+]+)$'
    return {op: float(n) for op, n in re.findall(pattern, text, flags=re.M)}


def measure(count: int, endpoint: str, env: dict[str, str], args: argparse.Namespace) -> dict:
    from fnrt.functions.routing import Routing
    from fnrt.loader.repository import Repository, now_iso
    from fnrt.loader.stores import open_store
    from fnrt.loader.stores.s3 import S3Config

    work = Path(tempfile.mkdtemp(prefix=f"fnrt-bench-feed-{count}-"))
    store_uri = f"s3://bench/n{count}"
    proc = None
    try:
        started = time.perf_counter()
        deployed = populate(store_uri, endpoint, count, work)
        print(f"{count} functions stored in {time.perf_counter() - started:.1f} s", flush=True)
        flags = ("--s3-endpoint", endpoint, "--watch-interval-s", "1", "--no-request-log")
        url, proc = start_fnrt(store_uri, work / "cache", env, *flags)
        wait_ready(f"{url}/readyz", proc)
        before = store_requests(url)
        writer = Repository(open_store(store_uri, S3Config(endpoint_url=endpoint)))
        changes = 0
        rng = random.Random(0)
        deadline = time.monotonic() + args.window_s
        while time.monotonic() < deadline:
            time.sleep(min(args.change_every_s, max(deadline - time.monotonic(), 0)))
            if time.monotonic() >= deadline:
                break
            name, version = rng.choice(deployed)
            writer.update_routing(name, lambda _, v=version: Routing({v: 100}, (), now_iso()))
            changes += 1
        after = store_requests(url)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    per_minute = {op: (after.get(op, 0) - before.get(op, 0)) * 60 / args.window_s for op in after}
    return {"count": count, "changes": changes, "per_minute": per_minute}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, nargs="+", default=[10, 1000])
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--change-every-s", type=float, default=5.0)
    args = parser.parse_args()
    import os

    env = os.environ | CREDENTIALS
    os.environ.update(CREDENTIALS)
    endpoint, moto = start_moto(env)
    try:
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        results = [measure(n, endpoint, env, args) for n in args.functions]
    finally:
        moto.terminate()
        moto.wait(30)
    print(
        f"\none idle node, polling every 1 s, a routing change every {args.change_every_s:g} s, "
        f"{args.window_s:g} s window\n"
    )
    print(f"{'functions':>9}  {'store requests/min':>18}  {'ratio':>6}  by operation")
    base = sum(results[0]["per_minute"].values())
    for r in results:
        total = sum(r["per_minute"].values())
        ops = ", ".join(f"{op} {v:.0f}" for op, v in sorted(r["per_minute"].items()) if v)
        print(f"{r['count']:>9}  {total:>18.0f}  {total / base:>5.2f}x  {ops}")
    print(
        "\nbefore the change feed a node read every function it served once per poll: "
        + ", ".join(f"{r['count'] * 60:,}/min at {r['count']}" for r in results)
        + " (computed)"
    )


if __name__ == "__main__":
    main()
