"""Three nodes on one S3 store behind nginx running ``infra/nginx/fnrt.conf``."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from fleetsupport import Fleet, fleet

from fnrt.runtime.cli.main import main
from support import ECHO_HANDLER, wait_until, write_function

X = {"x": [[1.0, 2.0, 3.0, 4.0]]}


def _deploy(folder: Path, server: str) -> None:
    assert main(["deploy", str(folder), "--server", server, "-q"]) == 0


def _version(url: str) -> str:
    return str(httpx.get(f"{url}/v1/functions/echo", timeout=10).json()["version"])


def _invoke(c: httpx.Client, url: str, name: str = "echo") -> httpx.Response:
    return c.post(f"{url}/v1/functions/{name}/invoke", json=X, timeout=60)


def test_a_deploy_through_one_node_reaches_every_node_and_hashing_holds(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        a, b, c = f.nodes
        _deploy(write_function(tmp_path / "src", "echo"), a.url)
        with httpx.Client() as client:
            r = _invoke(client, f.url)
            assert r.status_code == 200 and r.json() == {"y": [[2, 4, 6, 8]]}
            for node in f.nodes:  # every node serves it, whichever nginx chose
                assert _invoke(client, node.url).json() == {"y": [[2, 4, 6, 8]]}
            # a hot swap through C reaches A and B within two poll intervals (0.5 s)
            tripled = ECHO_HANDLER.replace("2.0", "3.0")
            _deploy(write_function(tmp_path / "v2", "echo", tripled), c.url)
            swapped = time.monotonic()  # the routing was written before the deploy returned
            new = httpx.get(f"{c.url}/v1/functions/echo").json()["version"]
            for node in (a, b):
                wait_until(lambda n=node: _version(n.url) == new, 5)
            assert time.monotonic() - swapped < 2 * 0.5 + 0.5  # two polls (and slack)
            for url in (a.url, b.url, f.url):  # and they serve it
                assert _invoke(client, url).json() == {"y": [[3, 6, 9, 12]]}

            # hash routing: calls for a function load it on one node only
            names = [f"fn{i}" for i in range(3)]
            for name in names:
                _deploy(write_function(tmp_path / "src", name), b.url)
            _call_each(f, client, names, 4)
            for name in names:
                assert sorted(f.loads(name)) == [0, 0, 1], name

            # a saturated node passes a hot function on
            _spills_when_saturated(f, tmp_path)


def _call_each(f: Fleet, client: httpx.Client, names: list[str], times: int) -> None:
    for _ in range(times):
        for name in names:
            assert _invoke(client, f.url, name).status_code == 200


def test_round_robin_loads_a_function_on_every_node(tmp_path: Path) -> None:
    with fleet(tmp_path, 3, "round_robin") as f, httpx.Client() as client:
        names = [f"fn{i}" for i in range(4)]  # 4 names over 3 nodes: each meets every node
        for name in names:
            _deploy(write_function(tmp_path / "src", name), f.nodes[0].url)
        _call_each(f, client, names, 3)
        for name in names:
            assert f.loads(name) == [1, 1, 1], name  # every node loads every function


def _hammer(url: str, clients: int, stop: threading.Event) -> list[int | str]:
    """``clients`` threads calling ``url`` until ``stop``: every status, or the error."""
    outcomes: list[int | str] = []
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client() as c:
            while not stop.is_set():
                try:
                    status: int | str = _invoke(c, url).status_code
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                with lock:
                    outcomes.append(status)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(60)
    return outcomes


def _holder(f: Fleet, name: str) -> int:
    loads = f.loads(name)
    assert sorted(loads) == [0, 0, 1], loads
    return loads.index(1)


def test_a_node_killed_under_load_fails_no_client_request(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, httpx.Client() as client:
        _deploy(write_function(tmp_path / "src", "echo"), f.nodes[0].url)
        assert _invoke(client, f.url).status_code == 200
        victim = f.nodes[_holder(f, "echo")]  # the node that holds it warm
        stop = threading.Event()
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(_hammer, f.url, 32, stop)
            time.sleep(1.0)
            victim.proc.send_signal(signal.SIGKILL)
            time.sleep(2.0)  # the other nodes take over (one loads it)
            stop.set()
            outcomes = running.result()
        assert outcomes and set(outcomes) == {200}, sorted(set(map(str, outcomes)))
        assert sum(n for n in f.loads("echo") if n > 0) == 1  # one survivor took it on


def test_a_node_stopped_under_load_fails_no_request_and_was_unready_first(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, 3, "hash", "--drain-delay-s", "1") as f, httpx.Client() as client:
        _deploy(write_function(tmp_path / "src", "echo"), f.nodes[0].url)
        assert _invoke(client, f.url).status_code == 200
        victim = f.nodes[_holder(f, "echo")]
        seen: dict[str, float] = {}

        def probe() -> None:  # what an orchestrator's probe and a new client see
            with httpx.Client() as c:
                while "refused" not in seen:
                    try:
                        if c.get(f"{victim.url}/readyz", timeout=1).status_code == 503:
                            seen.setdefault("unready", time.monotonic())
                    except httpx.ConnectError:
                        seen["refused"] = time.monotonic()
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.02)

        stop = threading.Event()
        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(_hammer, f.url, 32, stop)
            probing = pool.submit(probe)
            time.sleep(1.0)
            victim.proc.send_signal(signal.SIGTERM)
            assert victim.proc.wait(30) == 0
            time.sleep(1.0)
            stop.set()
            outcomes = running.result()
            probing.result(10)
        assert outcomes and set(outcomes) == {200}, sorted(set(map(str, outcomes)))
        assert seen["unready"] < seen["refused"] - 0.5  # unready through the drain delay


SLOW_HANDLER = """
import time

class Slow:
    def load(self, artifacts, device):
        pass

    def __call__(self, batch):
        time.sleep(0.3)
        return [{"y": r["x"]} for r in batch]
"""


def _spills_when_saturated(f: Fleet, tmp_path: Path) -> None:
    """One request at a time per node, two waiting: the node the hash picks answers
    429 past that, and nginx passes the request to the next node on the ring."""
    manifest = (
        'name = "{name}"\nhandler = "handler:Slow"\n[batching]\nmax_batch_size = 1\n'
        "[scaling]\nmax_queue = {max_queue}\n"
    )
    folder = write_function(tmp_path / "src", "hot", SLOW_HANDLER, manifest, max_queue=2)
    _deploy(folder, f.nodes[0].url)
    with httpx.Client() as client:
        assert _invoke(client, f.url, "hot").status_code == 200
    home = _holder(f, "hot")
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: httpx.post(
            f"{f.url}/v1/functions/hot/invoke", json=X, timeout=60), range(6)))  # fmt: skip
    assert [r.status_code for r in answers] == [200] * 6
    loads = f.loads("hot")
    assert loads[home] == 1 and sum(1 for n in loads if n > 0) >= 2, loads  # spilled over
