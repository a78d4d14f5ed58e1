"""Throughput through nginx (infra/nginx/fnrt.conf) with 1, 2 and 3 fnrt nodes.

    python bench/fleet.py [--connections 64] [--duration-s 8] [--rounds 3]
                          [--routing hash|round_robin]

Three nodes serve one S3 store (moto's server on 127.0.0.1) holding the
``mlp`` example under three names; wrk calls the three in turn through nginx,
whose upstream lists 1, 2 or 3 of the nodes (nginx restarted between, the
nodes kept). The baseline, measured in the same rounds, is wrk calling one
node directly. Prints requests/s, p50, p99 and the ratio to the baseline.
Every process shares this machine's cores: with fewer cores than nodes, more
nodes cannot add throughput, only the ingress's cost shows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from loadgen import (
    ROOT,
    Result,
    copy_mlp,
    free_port,
    report,
    require_wrk,
    start_fnrt,
    start_moto,
    wait_ready,
    wrk,
)

sys.path.insert(0, str(ROOT / "tests"))
from fleetsupport import render_nginx  # the fleet tests render nginx the same way

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}
FUNCTIONS = ("mlp0", "mlp1", "mlp2")
LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("{body}", "rb")
wrk.body = f:read("*all")
f:close()
local paths = {{{paths}}}
local i = 0
request = function()
  i = i + 1
  return wrk.format(nil, paths[(i % #paths) + 1])
end
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--duration-s", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--routing", choices=["hash", "round_robin"], default="hash")
    args = parser.parse_args()
    require_wrk()
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(binary, os.X_OK):
        raise SystemExit("nginx is not installed: apt-get install nginx")
    work = Path(tempfile.mkdtemp(prefix="fnrt-bench-fleet-"))
    env = os.environ | CREDENTIALS | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        endpoint, moto = start_moto(env)
        procs.append(moto)
        import boto3

        os.environ.update(CREDENTIALS)
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        example, _ = copy_mlp(work)
        store = "s3://bench/fleet"
        for name in FUNCTIONS:  # straight into the store
            argv = [sys.executable, "-m", "fnrt.runtime.cli.main", "deploy", str(example)]
            argv += ["--name", name, "--store", store, "--s3-endpoint", endpoint, "-q"]
            subprocess.run(argv, env=env, check=True, capture_output=True)
        nodes = []
        for i in range(3):
            (work / f"node{i}").mkdir()
            flags = ("--s3-endpoint", endpoint, "--no-request-log")
            url, proc = start_fnrt(store, work / f"node{i}" / "cache", env, *flags)
            procs.append(proc)
            nodes.append(url)
        x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
        (work / "body.json").write_text(json.dumps({"x": x.tolist()}))
        paths = ", ".join(f'"/v1/functions/{n}/invoke"' for n in FUNCTIONS)
        script = work / "rotate.lua"
        script.write_text(LUA.format(body=work / "body.json", paths=paths))

        def through_nginx(count: int) -> tuple[str, subprocess.Popen[bytes]]:
            conf_dir = work / f"nginx{count}"
            shutil.rmtree(conf_dir, ignore_errors=True)
            conf_dir.mkdir()
            port = free_port()
            hosts = [n.removeprefix("http://") for n in nodes[:count]]
            conf = render_nginx(conf_dir, port, hosts, args.routing)
            proc = subprocess.Popen([binary, "-c", str(conf), "-p", str(conf_dir)])
            wait_ready(f"http://127.0.0.1:{port}/healthz", proc)
            return f"http://127.0.0.1:{port}", proc

        variants = {"direct": 0, "nginx+1": 1, "nginx+2": 2, "nginx+3": 3}
        results: dict[str, list[Result]] = {name: [] for name in variants}
        for url in nodes:  # every node loads every function before any round
            wrk(url, script, 8, 2)
        for _ in range(args.rounds):
            for name, count in variants.items():
                if count == 0:
                    results[name].append(wrk(nodes[0], script, args.connections, args.duration_s))
                    continue
                url, nginx = through_nginx(count)
                try:
                    wrk(url, script, 8, 1)  # nginx's upstream connections
                    results[name].append(wrk(url, script, args.connections, args.duration_s))
                finally:
                    nginx.terminate()
                    nginx.wait(10)
                time.sleep(0.5)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    cores = os.cpu_count()
    print(
        f"\nmlp under 3 names, JSON, {args.connections} connections, {args.routing} routing, "
        f"{args.rounds} rounds of {args.duration_s} s, {cores} cores\n"
    )
    report(results, "direct", "served by")


if __name__ == "__main__":
    main()
