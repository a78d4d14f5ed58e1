"""Ten thousand functions on one node: what each deployed function costs it.

    python bench/scale.py [--counts 10,1000,10000] [--calls 2000]

For each count, a store is filled with that many tiny numpy functions (one
handler and bundle shared by all; each its own manifest and routing, in the
store's layout), then one ``fnrt serve`` serves it with handlers in threads
(``--isolation thread``: the figures are the node's own, not a worker
process's start). Measured for every count, in the same run:

- idle RSS per function: the node's RSS after it started and sat idle 3 s,
  less the smallest count's, over the functions added;
- idle CPU: the node's CPU time over 5 idle seconds (work that wakes per
  function per second shows here);
- first call: the median time of the first call of 20 functions never called;
- warm p99: one warm function, ``wrk`` with 4 connections, the median of three
  3 s runs;
- listing: one page (``GET /v1/functions?limit=100``), median of 10.

With ``--served``, then every function is called once and unloaded again
(``POST .../unload``; ``f00000`` stays warm), as on a node that has served them
all and kept none: the RSS per function served, and the warm p99 again while
a scraper reads ``/metrics`` every ``--scrape-every-s`` (Prometheus' way: a
scrape after the last one ended), with the longest scrape the scraper saw.
``--rev`` serves fnrt at another git revision (exported, on ``PYTHONPATH``) to
compare two in two runs.

The table prints each figure and its ratio against the smallest count.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
from coldstart_ab import export
from loadgen import BIN, require_wrk, start_fnrt, write_script, wrk

HANDLER = """
import numpy as np

def handle(batch):
    return [{"y": r["x"] * 2.0} for r in batch]
"""
MANIFEST = """
name = "f00000"
handler = "handler:handle"

[inputs]
x = { dtype = "float32", shape = [-1, 4] }

[outputs]
y = { dtype = "float32", shape = [-1, 4] }
"""
BODY = b'{"x": [[1, 2, 3, 4]]}'


@dataclass(frozen=True)
class Figures:
    count: int
    rss_kb: float
    idle_cpu_ms: float
    first_call_ms: float
    warm_p99_ms: float
    listing_ms: float
    start_s: float
    served_rss_kb: float = 0.0  # --served: every function called once and unloaded
    scraped_p99_ms: float = 0.0  # and the warm p99 while /metrics is scraped
    longest_scrape_ms: float = 0.0


def fill_store(store: Path, work: Path, count: int) -> None:
    """``count`` functions ``f00000``... sharing one bundle: the first deployed with
    ``fnrt deploy --store`` (its handler checked), the rest written beside it."""
    from fnrt.functions.routing import Routing
    from fnrt.loader.repository import Repository, now_iso
    from fnrt.loader.stores import open_store

    folder = work / "template"
    folder.mkdir(exist_ok=True)
    (folder / "handler.py").write_text(textwrap.dedent(HANDLER))
    (folder / "fnrt.toml").write_text(textwrap.dedent(MANIFEST))
    argv = [str(BIN / "fnrt"), "deploy", str(folder), "--store", str(store), "-q"]
    subprocess.run(argv, check=True, capture_output=True)
    repository = Repository(open_store(str(store)))
    first = repository.get_version("f00000", repository.get_routing("f00000")[0].primary)
    stamp = now_iso()
    for i in range(1, count):
        name = f"f{i:05d}"
        vm = replace(first, manifest=replace(first.manifest, name=name))
        repository.put_version(vm)
        routing = Routing.first(vm.version, stamp)
        repository.store.put(f"functions/{name}/routing.json", routing.to_json())


def rss_kb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return float(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / 100.0


def measure(
    count: int, work: Path, env: dict[str, str], served: bool, scrape_every_s: float
) -> Figures:
    store = work / f"store-{count}"
    fill_store(store, work, count)
    started = time.perf_counter()
    url, proc = start_fnrt(str(store), work / f"cache-{count}", env, "--isolation", "thread")
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            while client.get("/readyz").status_code != 200:
                time.sleep(0.05)
            start_s = time.perf_counter() - started
            time.sleep(3)
            rss = rss_kb(proc.pid)
            before = cpu_s(proc.pid)
            time.sleep(5)
            idle_cpu = cpu_s(proc.pid) - before
            firsts = []
            for i in range(1, min(21, count)):
                t = time.perf_counter()
                r = client.post(f"/v1/functions/f{i:05d}/invoke", content=BODY,
                                headers={"content-type": "application/json"})  # fmt: skip
                firsts.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200, r.text
            listings = []
            for _ in range(10):
                t = time.perf_counter()
                page = client.get("/v1/functions", params={"limit": 100})
                listings.append((time.perf_counter() - t) * 1000)
                assert page.status_code == 200 and page.json()["functions"], page.text
        script = write_script(work, f"invoke-{count}", "application/json", BODY)
        wrk(f"{url}/v1/functions/f00000/invoke", script, 4, 2)  # warm up
        runs = [wrk(f"{url}/v1/functions/f00000/invoke", script, 4, 3) for _ in range(3)]
        warm_p99 = statistics.median(r.p99_ms for r in runs)
        served_figures = serve_all(url, proc.pid, count, script, scrape_every_s) if served else ()
    finally:
        proc.terminate()
        proc.wait(30)
    time.sleep(1)  # nothing of this node left when the next one starts
    return Figures(
        count,
        rss,
        idle_cpu * 1000,
        statistics.median(firsts),
        warm_p99,
        statistics.median(listings),
        start_s,
        *served_figures,
    )


def serve_all(
    url: str, pid: int, count: int, script: Path, scrape_every_s: float
) -> tuple[float, float, float]:
    """Call every function once and unload it (``f00000`` stays warm); the node's RSS
    then, the warm p99 (three 10 s runs) while ``/metrics`` is scraped every
    ``scrape_every_s``, and the longest scrape."""
    with httpx.Client(base_url=url, timeout=600) as client:
        for i in range(count):
            r = client.post(f"/v1/functions/f{i:05d}/invoke", content=BODY,
                            headers={"content-type": "application/json"})  # fmt: skip
            assert r.status_code == 200, r.text
        for i in range(1, count):
            assert client.post(f"/v1/functions/f{i:05d}/unload").status_code == 200
    time.sleep(2)
    rss = rss_kb(pid)
    stop, scrapes = threading.Event(), []

    def scrape() -> None:
        with httpx.Client(base_url=url, timeout=600) as client:
            while not stop.wait(scrape_every_s):
                started = time.perf_counter()
                assert client.get("/metrics").status_code == 200
                scrapes.append((time.perf_counter() - started) * 1000)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        runs = [wrk(f"{url}/v1/functions/f00000/invoke", script, 4, 10) for _ in range(3)]
    finally:
        stop.set()
        scraper.join()
    return rss, statistics.median(r.p99_ms for r in runs), max(scrapes, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="10,1000,10000")
    parser.add_argument(
        "--served",
        action="store_true",
        help="also call every function once and unload it: RSS per function served, "
        "and the warm p99 while /metrics is scraped",
    )
    parser.add_argument("--scrape-every-s", type=float, default=10.0)
    parser.add_argument("--rev", default=".", help="serve fnrt at this git revision")
    args = parser.parse_args()
    require_wrk()
    counts = [int(c) for c in args.counts.split(",")]
    work = Path(tempfile.mkdtemp(prefix="fnrt-scale-"))
    try:
        env = export(args.rev, work, "rev")
        results = []
        for count in counts:
            figures = measure(count, work, env, args.served, args.scrape_every_s)
            print(f"measured {count} functions: {figures}", file=sys.stderr, flush=True)
            results.append(figures)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = results[0]
    print(
        f"{'functions':>9} {'RSS MB':>8} {'KB/fn':>7} {'idle CPU ms/s':>13} {'first ms':>9} "
        f"{'warm p99 ms':>11} {'list ms':>8} {'start s':>8}"
    )
    for r in results:
        per_fn = (r.rss_kb - base.rss_kb) / (r.count - base.count) if r is not base else 0.0
        print(
            f"{r.count:>9} {r.rss_kb / 1024:>8.1f} {per_fn:>7.1f} {r.idle_cpu_ms / 5:>13.1f} "
            f"{r.first_call_ms:>9.2f} {r.warm_p99_ms:>11.2f} {r.listing_ms:>8.2f} {r.start_s:>8.1f}"
        )
    print()
    for r in results[1:]:
        print(
            f"{r.count} / {base.count} functions: "
            f"first call {r.first_call_ms / base.first_call_ms:.2f}x, "
            f"warm p99 {r.warm_p99_ms / base.warm_p99_ms:.2f}x, "
            f"listing {r.listing_ms / base.listing_ms:.2f}x, "
            f"idle CPU {r.idle_cpu_ms / max(base.idle_cpu_ms, 1e-3):.2f}x, "
            f"{(r.rss_kb - base.rss_kb) / (r.count - base.count):.1f} KB per function added"
        )
    if args.served:
        print(
            f"\nevery function served once and unloaded; /metrics every {args.scrape_every_s:g} s"
        )
        print(
            f"{'functions':>9} {'RSS MB':>8} {'KB/fn':>7} {'p99 scraped ms':>15} "
            f"{'longest scrape ms':>18}"
        )
        for r in results:
            per_fn = (
                (r.served_rss_kb - base.served_rss_kb) / (r.count - base.count)
                if r is not base
                else 0.0
            )
            print(
                f"{r.count:>9} {r.served_rss_kb / 1024:>8.1f} {per_fn:>7.1f} "
                f"{r.scraped_p99_ms:>15.2f} {r.longest_scrape_ms:>18.1f}"
            )


if __name__ == "__main__":
    main()
