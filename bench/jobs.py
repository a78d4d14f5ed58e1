"""Asynchronous jobs: throughput against invoking each record, and what a backlog costs
live requests.

    python bench/jobs.py [--records 100000] [--connections 32] [--duration-s 10]
                         [--rounds 2] [--load 0.5]

One ``fnrt serve`` (the product's defaults: worker processes, the request log on,
jobs on) serves ``examples/mlp`` (weights made by its own script). Records are
``x``: float32 [1, 64] drawn at random, the same ones on both sides.

1. **Throughput.** ``wrk`` invokes the records one request at a time, 32 at once
   (msgpack, the faster format; each connection takes the next record of the
   first 1,000, in turn), against a job of ``--records`` of them submitted as an
   ``.npz`` file. The job's figure is end to end: the upload and the check of
   every record included, from the submit until ``done``. Rounds alternate.
2. **Live latency with a backlog.** ``wrk`` holds ``--load`` of the invoke
   capacity just measured (each connection waits between requests), once on
   an idle server and once while a job of 3x ``--records`` is running; the
   rounds alternate, and the job is cancelled after each. The job's own
   records/s while live traffic runs is what it took of the idle capacity.

Prints records/s and p99s, and the ratios against the baseline of the same run.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from pathlib import Path

import httpx
import msgpack
import msgpack_numpy
import numpy as np
from loadgen import DELAY, Result, deploy, median, mlp_server, require_wrk, wrk

CYCLE = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/msgpack"
local f = io.open("{bodies}", "rb")
local data = f:read("*all")
f:close()
local size = {size}
local bodies = {{}}
for i = 0, #data / size - 1 do
  bodies[i + 1] = data:sub(i * size + 1, (i + 1) * size)
end
local n = 0
request = function()
  n = n % #bodies + 1
  return wrk.format(nil, nil, nil, bodies[n])
end
"""


def cycle_script(work: Path, x: np.ndarray, delay_ms: int | None = None) -> Path:
    """A wrk script that POSTs the records of ``x`` (one msgpack body each) in turn."""
    bodies = [msgpack.packb({"x": row}, default=msgpack_numpy.encode) for row in x]
    assert len({len(b) for b in bodies}) == 1
    (work / "bodies.bin").write_bytes(b"".join(bodies))
    text = CYCLE.format(bodies=work / "bodies.bin", size=len(bodies[0]))
    if delay_ms is not None:
        text += DELAY.format(delay_ms=delay_ms)
    name = "cycle.lua" if delay_ms is None else "paced.lua"
    (work / name).write_text(text)
    return work / name


def submit(url: str, x: np.ndarray) -> tuple[str, float]:
    """Submit a job of ``x``'s rows as an .npz body; its id and the submit time."""
    buf = io.BytesIO()
    np.savez(buf, x=x)
    started = time.perf_counter()
    r = httpx.post(
        f"{url}/v1/functions/mlp/jobs",
        content=buf.getvalue(),
        headers={"content-type": "application/x-npz"},
        timeout=600,
    )
    r.raise_for_status()
    return r.json()["id"], started


def status(url: str, job: str) -> dict:
    return httpx.get(f"{url}/v1/jobs/{job}", timeout=60).json()


def run_job(url: str, x: np.ndarray) -> tuple[float, float]:
    """A whole job of ``x``: records/s end to end, and records/s while it ran."""
    job, started = submit(url, x)
    while (now := status(url, job))["state"] not in ("done", "failed", "cancelled"):
        time.sleep(0.05)
    ended = time.perf_counter()
    assert now["state"] == "done" and now["progress"]["records_failed"] == 0, now
    return len(x) / (ended - started), len(x) / now["timings"]["running_s"]


def with_backlog(
    url: str, x: np.ndarray, script: Path, args: argparse.Namespace
) -> tuple[Result, float, bool]:
    """Live requests while a job of ``x`` runs: their figures, the job's records/s
    meanwhile, and whether the job still had work left at the end."""
    job, _ = submit(url, x)
    while status(url, job)["progress"]["records_done"] == 0:
        time.sleep(0.05)
    before = status(url, job)["progress"]["records_done"]
    t0 = time.perf_counter()
    live = wrk(f"{url}/v1/functions/mlp/invoke", script, args.connections, args.duration_s)
    elapsed = time.perf_counter() - t0
    after = status(url, job)
    rate = (after["progress"]["records_done"] - before) / elapsed
    still = after["state"] == "running"
    httpx.delete(f"{url}/v1/jobs/{job}", timeout=60)
    while "fnrt_job_chunks_running 0.0" not in httpx.get(f"{url}/metrics").text:
        time.sleep(0.05)  # the chunks in flight finish
    return live, rate, still


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration-s", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--load", type=float, default=0.5, help="live rate, of capacity")
    args = parser.parse_args()
    require_wrk()
    with mlp_server("fnrt-bench-jobs-") as (work, example, url):
        deploy(url, example)
        x = np.random.default_rng(0).standard_normal((args.records, 1, 64)).astype(np.float32)
        invoke = f"{url}/v1/functions/mlp/invoke"
        script = cycle_script(work, x[:1000])
        wrk(invoke, script, args.connections, 2)  # warm up: load the instance
        run_job(url, x[:5000])

        invoked: list[Result] = []
        jobs: list[tuple[float, float]] = []
        for _ in range(args.rounds):
            invoked.append(wrk(invoke, script, args.connections, args.duration_s))
            jobs.append(run_job(url, x))
        best = median(invoked)
        print(
            f"\nmlp, {args.records:,} records; invokes: {args.connections} connections, "
            f"{args.duration_s} s x {args.rounds} rounds\n"
        )
        print(f"{'':<34} {'records/s':>10}")
        print(f"{'invoke, one record a request':<34} {best.rps:>10,.0f}")
        e2e = statistics.median(j[0] for j in jobs)
        running = statistics.median(j[1] for j in jobs)
        ratios = [j[0] / i.rps for j, i in zip(jobs, invoked, strict=True)]
        print(f"{'job, end to end (upload, checks)':<34} {e2e:>10,.0f}")
        print(f"{'job, while running':<34} {running:>10,.0f}")
        print(
            f"\njob / invoke throughput: {statistics.median(ratios):.2f}x end to end, the "
            f"median round (per round {[round(r, 2) for r in ratios]}); "
            f"{running / best.rps:.2f}x while running"
        )

        rate = best.rps * args.load
        delay_ms = max(int(args.connections * 1000 / rate - best.p50_ms / 2), 1)
        paced = cycle_script(work, x[:1000], delay_ms)
        backlog = np.concatenate([x] * 3)
        idle: list[Result] = []
        busy: list[Result] = []
        took: list[float] = []
        for _ in range(args.rounds):
            idle.append(wrk(invoke, paced, args.connections, args.duration_s))
            live, job_rate, still = with_backlog(url, backlog, paced, args)
            if not still:
                print("warning: the backlog ran out during a round; use more --records")
            busy.append(live)
            took.append(job_rate)
        a, b = median(idle), median(busy)
        print(
            f"\nlive at {args.load:.0%} of capacity ({rate:,.0f} req/s asked; got "
            f"{a.rps:,.0f} idle, {b.rps:,.0f} with the backlog)\n"
        )
        print(f"{'':<22} {'p50 ms':>8} {'p99 ms':>8} {'non-2xx':>8}")
        print(f"{'no job':<22} {a.p50_ms:>8.2f} {a.p99_ms:>8.2f} {a.errors:>8}")
        print(f"{'job backlog running':<22} {b.p50_ms:>8.2f} {b.p99_ms:>8.2f} {b.errors:>8}")
        ratios = [y.p99_ms / z.p99_ms for y, z in zip(busy, idle, strict=True)]
        print(
            f"\nlive p99 with / without a backlog: {statistics.median(ratios):.2f}x, the "
            f"median round (per round {[round(r, 2) for r in ratios]}); the job meanwhile: "
            f"{statistics.median(took):,.0f} records/s"
        )


if __name__ == "__main__":
    main()
