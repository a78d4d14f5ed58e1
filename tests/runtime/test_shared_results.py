"""``[result_cache] backend = "redis"``: one cache for every node, never a request error."""

from __future__ import annotations

from pathlib import Path

import httpx
from fleetsupport import redis_server

from fnrt.runtime.cli.main import main
from support import serve_process, wait_until, write_function

CACHED = """
name = "{name}"
handler = "handler:Echo"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}

[result_cache]
enabled = true
backend = "redis"
ttl_s = 600
"""


def _invoke(url: str, value: float) -> httpx.Response:
    x = {"x": [[value, 0.0, 0.0, 0.0]]}
    return httpx.post(f"{url}/v1/functions/cached/invoke", json=x, timeout=30)


def _cache(url: str) -> dict:
    return httpx.get(f"{url}/v1/functions/cached").json()["instance"]["result_cache"]


def test_two_nodes_share_one_cache_that_survives_a_redis_restart(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "src", "cached", manifest=CACHED)
    with redis_server(tmp_path) as redis:
        flags = ("--store", str(tmp_path / "store"), "--redis-url", redis.url)
        flags += ("--log-level", "error", "--no-request-log")
        with (
            serve_process(tmp_path / "a", *flags) as a,
            serve_process(tmp_path / "b", *flags) as b,
        ):
            assert main(["deploy", str(folder), "--server", a.url, "-q"]) == 0
            first = _invoke(a.url, 1)
            assert first.status_code == 200 and "x-fnrt-cache" not in first.headers
            wait_until(lambda: _invoke(b.url, 1).headers.get("x-fnrt-cache") == "hit", 5)
            assert _invoke(b.url, 1).json() == {"y": [[2, 0, 0, 0]]}  # computed on A only
            assert _cache(b.url)["backend"] == "redis"

            redis.stop()  # down: every call is served, uncached, and the failure counted
            answers = [_invoke(node.url, v) for v in (2, 3, 4) for node in (a, b)]
            assert [r.status_code for r in answers] == [200] * 6
            assert [r.json()["y"][0][0] for r in answers] == [4, 4, 6, 6, 8, 8]
            assert _cache(a.url)["errors"] >= 1 and _cache(a.url)["last_error"]

            redis.start()  # back, empty: caching resumes within the retry pause

            def shared_again() -> bool:
                assert _invoke(a.url, 5).status_code == 200
                return _invoke(b.url, 5).headers.get("x-fnrt-cache") == "hit"

            wait_until(shared_again, 10)
