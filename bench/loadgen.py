"""Shared pieces of the serving benchmarks: servers on free ports, and wrk as the load."""

from __future__ import annotations

import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent

LUA = """
wrk.method = "POST"
{headers}
local f = io.open("{body}", "rb")
wrk.body = f:read("*all")
f:close()
"""

#: Appended to a script: each connection waits this long after each answer (a rate
#: held below capacity).
DELAY = """
function delay()
  return {delay_ms}
end
"""


@dataclass(frozen=True)
class Result:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    #: CPU the server's processes (workers included) spent per request, when wrk was
    #: given its pid: steadier than requests/s on a shared machine, whose share of the
    #: cores drifts from run to run.
    cpu_us: float | None = None


def stat_cpu_s(stat: Path) -> float:
    """CPU seconds (user and system) in a ``/proc/.../stat`` file (a process's or a
    thread's)."""
    text = stat.read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user and system) that ``pid`` and its live descendants have used."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += stat_cpu_s(Path(f"/proc/{current}/stat"))
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):  # it exited meanwhile
            continue
    return total


def require_wrk() -> None:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    """Poll ``url`` until it answers (any status) or the process dies."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} not ready in {timeout_s}s")


def write_script(
    work: Path,
    name: str,
    content_type: str | None,
    body: bytes,
    headers: dict[str, str] | None = None,
) -> Path:
    """A wrk Lua script that POSTs ``body`` with ``content_type`` (None: no Content-Type,
    as tritonclient sends) and any other ``headers``."""
    (work / f"{name}.body").write_bytes(body)
    wanted = dict(headers or {})
    if content_type is not None:
        wanted["Content-Type"] = content_type
    lines = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in wanted.items())
    script = work / f"{name}.lua"
    script.write_text(LUA.format(headers=lines, body=work / f"{name}.body"))
    return script


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    assert match is not None, text
    value, unit = match.groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def pin(pid: int, cpus: str, children_cpus: str) -> None:
    """Pin process ``pid`` (every thread) to ``cpus`` and its live descendants (worker
    processes, the span shipper) to ``children_cpus`` (``taskset`` lists: "0", "1-3")."""
    subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], check=True, capture_output=True)
    todo = [pid]
    while todo:
        current = todo.pop()
        for task in Path(f"/proc/{current}/task").iterdir():
            for child in (task / "children").read_text().split():
                todo.append(int(child))
                argv = ["taskset", "-a", "-p", "-c", children_cpus, child]
                subprocess.run(argv, check=True, capture_output=True)


def wrk(
    url: str,
    script: Path,
    connections: int,
    duration_s: int,
    pid: int | None = None,
    cpus: str | None = None,
) -> Result:
    """Load ``url`` with ``wrk`` (on ``cpus`` when given, a ``taskset`` list); with ``pid``
    (the server's), also the CPU it spent per request."""
    cpu_before = tree_cpu_s(pid) if pid is not None else 0.0
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency", "-s", str(script)]
    if cpus is not None:
        argv = ["taskset", "-c", cpus, *argv]
    out = subprocess.run(
        [*argv, url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout

    def find(pattern: str) -> str:
        match = re.search(pattern, out)
        assert match is not None, out
        return match.group(1)

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    cpu_us = None
    if pid is not None:
        requests = int(find(r"(\d+) requests in"))
        cpu_us = (tree_cpu_s(pid) - cpu_before) / max(requests, 1) * 1e6
    return Result(
        float(find(r"Requests/sec:\s+([\d.]+)")),
        _ms(find(r"\s50%\s+(\S+)")),
        _ms(find(r"\s99%\s+(\S+)")),
        int(errors.group(1)) if errors else 0,
        cpu_us,
    )


def report(results: dict[str, list[Result]], baseline: str, column: str) -> None:
    """The median round of each variant, and every round's requests/s against
    ``baseline``'s in the same round (with their median); with CPU figures, the
    median CPU per request of each variant against the baseline's."""
    cpu = all(r.cpu_us is not None for rounds in results.values() for r in rounds)
    extra = f" {'CPU us/req':>11} {'CPU ratio':>9}" if cpu else ""
    print(
        f"{column:<12} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'non-2xx':>8} {'ratio':>7}{extra}"
    )
    base = median(results[baseline]).rps
    base_cpu = median_cpu_us(results[baseline]) if cpu else 0.0
    for name, rounds in results.items():
        r = median(rounds)
        line = (
            f"{name:<12} {r.rps:>9.0f} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f} "
            f"{r.errors:>8} {r.rps / base:>6.2f}x"
        )
        if cpu:
            used = median_cpu_us(rounds)
            line += f" {used:>11.0f} {used / base_cpu:>8.2f}x"
        print(line)
    print()
    for name in results:
        per_round = [
            round(a.rps / b.rps, 2) for a, b in zip(results[name], results[baseline], strict=True)
        ]
        print(
            f"{name} / {baseline} requests/s per round: {per_round}, "
            f"median {statistics.median(per_round):.2f}x"
        )
    if cpu:
        for name, rounds in results.items():
            print(f"{name} CPU us/req per round: {[round(r.cpu_us or 0) for r in rounds]}")


def median_cpu_us(results: list[Result]) -> float:
    """The median CPU per request over rounds (rounds measured with a pid)."""
    return statistics.median(r.cpu_us for r in results if r.cpu_us is not None)


def median(results: list[Result]) -> Result:
    """The round with the median requests/s."""
    ordered = sorted(results, key=lambda r: r.rps)
    return ordered[len(ordered) // 2]


def start_moto(env: dict[str, str]) -> tuple[str, subprocess.Popen[bytes]]:
    """moto's S3 server in its own process on a free port; its URL and process, once
    it answers."""
    port = free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    wait_ready(f"{endpoint}/moto-api/", proc)
    return endpoint, proc


def start_fnrt(
    store: str, cache_dir: Path, env: dict[str, str], *extra: str, stderr: Any = None
) -> tuple[str, subprocess.Popen[bytes]]:
    """``fnrt serve`` on a free port; its URL and process, once it answers.

    Its stderr (warnings and the request log, on as in production) goes to
    ``stderr``, by default a file beside ``cache_dir``.
    """
    port = free_port()
    argv = [str(BIN / "fnrt"), "serve", "--port", str(port), "--store", store]
    argv += ["--cache-dir", str(cache_dir), "--log-level", "warning", *extra]
    if stderr is None:
        with open(Path(cache_dir).parent / f"fnrt-{port}.log", "wb") as log:
            proc = subprocess.Popen(argv, env=env, stderr=log)
    else:
        proc = subprocess.Popen(argv, env=env, stderr=stderr)
    url = f"http://127.0.0.1:{port}"
    wait_ready(f"{url}/healthz", proc)
    return url, proc


def deploy(server: str, folder: Path) -> None:
    argv = [str(BIN / "fnrt"), "deploy", str(folder), "--server", server, "-q"]
    subprocess.run(argv, check=True, capture_output=True)


def start_bare(
    example: Path, weights: Path, env: dict[str, str]
) -> tuple[str, subprocess.Popen[bytes]]:
    """The bare Starlette baseline (``bare_app.py``) for ``example``; its invoke URL and process."""
    port = free_port()
    argv = [sys.executable, str(Path(__file__).parent / "bare_app.py"), str(example), str(weights)]
    proc = subprocess.Popen([*argv, str(port)], env=env)
    wait_ready(f"http://127.0.0.1:{port}/", proc)
    return f"http://127.0.0.1:{port}/invoke", proc


def start_lean(
    example: Path, weights: Path, env: dict[str, str]
) -> tuple[str, subprocess.Popen[bytes]]:
    """The leanest batching server (``lean_app.py``) for ``example``: the design floor;
    its invoke URL and process."""
    port = free_port()
    argv = [sys.executable, str(Path(__file__).parent / "lean_app.py"), str(example), str(weights)]
    proc = subprocess.Popen([*argv, str(port)], env=env)
    wait_ready(f"http://127.0.0.1:{port}/", proc)
    return f"http://127.0.0.1:{port}/invoke", proc


def start_raw(env: dict[str, str], *extra: str) -> tuple[str, subprocess.Popen[bytes]]:
    """The raw ASGI constant answer (``raw_app.py``): the HTTP floor; its URL and process.
    ``--connection``: the same answered at the connection, without ASGI."""
    port = free_port()
    argv = [sys.executable, str(Path(__file__).parent / "raw_app.py"), str(port), *extra]
    proc = subprocess.Popen(argv, env=env)
    wait_ready(f"http://127.0.0.1:{port}/", proc)
    return f"http://127.0.0.1:{port}/invoke", proc


def copy_mlp(work: Path) -> tuple[Path, Path]:
    """A copy of ``examples/mlp`` in ``work`` with its weights made by its own script."""
    example = work / "mlp"
    shutil.copytree(
        ROOT / "examples" / "mlp",
        example,
        ignore=shutil.ignore_patterns("*.safetensors", "__pycache__"),
    )
    weights = example / "weights.safetensors"
    subprocess.run(
        [sys.executable, str(example / "make_weights.py"), "--out", str(weights)],
        check=True,
        capture_output=True,
    )
    return example, weights


@contextmanager
def mlp_server(prefix: str, *extra: str) -> Iterator[tuple[Path, Path, str]]:
    """A work folder (``prefix``), a copy of ``examples/mlp`` in it and one ``fnrt serve``
    (``extra`` flags) on a store there, one BLAS thread: the folder, the example and the
    server's URL. The server stops and the folder goes at the end."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc: subprocess.Popen[bytes] | None = None
    try:
        example, _ = copy_mlp(work)
        url, proc = start_fnrt(str(work / "store"), work / "cache", env, *extra)
        yield work, example, url
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def rounds(
    urls: dict[str, str], script: Path, connections: int, duration_s: int, count: int
) -> dict[str, list[Result]]:
    """Each of ``urls`` measured ``count`` times, interleaved (a burst of load on this
    shared machine hits every variant alike), after a 1 s warm-up each (which loads them)."""
    for url in urls.values():
        wrk(url, script, connections, 1)
    results: dict[str, list[Result]] = {name: [] for name in urls}
    for _ in range(count):
        for name, url in urls.items():
            results[name].append(wrk(url, script, connections, duration_s))
    return results
