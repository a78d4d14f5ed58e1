"""fnrt.client against a real server: numpy in and out, the options, typed errors, retries."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fnrt.client import (
    NO_RETRY,
    AsyncClient,
    BadRequestError,
    Client,
    DeadlineError,
    FnrtError,
    Format,
    InvalidInputError,
    NotFoundError,
    OverloadedError,
    RetryPolicy,
    Unreachable,
)
from fnrt.functions.codec import Format as CodecFormat
from fnrt.runtime import scheduler as sched
from support import (
    ECHO_HANDLER,
    LiveServer,
    free_port,
    gate,
    live_server,
    wait_until,
    write_function,
)

X = np.arange(8, dtype=np.float32).reshape(2, 4)

GATED = """
import fnrt_test_gates

def handle(batch):
    fnrt_test_gates.gate("release").wait(30)
    return [{"y": r["x"]} for r in batch]
"""

GATED_MANIFEST = """
name = "{name}"
handler = "handler:handle"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 4] }}

[batching]
max_batch_size = 1

[scaling]
max_queue = 1
"""


def _deploy(srv: LiveServer, folder: Path) -> str:
    return srv.deploy(folder).version


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with live_server(tmp_path) as srv:
        _deploy(srv, write_function(tmp_path / "src", "echo"))
        yield srv


def test_invoke_sends_and_returns_numpy_arrays_with_who_answered(server: LiveServer) -> None:
    with Client(server.url) as fnrt:
        result = fnrt.invoke("echo", x=X)
        listed = fnrt.list()
    assert isinstance(result["y"], np.ndarray) and result["y"].dtype == np.float32
    np.testing.assert_array_equal(result["y"], X * 2)
    assert result.function == "echo" and result.version.startswith("v-")
    assert list(result) == ["y"] and len(result) == 1
    assert result.cold_start in ("l2", "l3") and not result.cache_hit
    assert [f["name"] for f in listed] == ["echo"]


def test_inputs_may_be_a_mapping_and_json_is_spoken_too(server: LiveServer) -> None:
    with Client(server.url) as fnrt:
        result = fnrt.invoke("echo", {"x": X.tolist()}, format=Format.JSON)
    assert result["y"] == (X * 2).tolist()
    assert Format is CodecFormat


def test_a_pinned_version_answers_whatever_the_routing_says(
    tmp_path: Path, server: LiveServer
) -> None:
    first = server.call(server.registry.get("echo")).version.version
    tripled = ECHO_HANDLER.replace("self.scale = 2.0", "self.scale = 3.0")
    second = _deploy(server, write_function(tmp_path / "v2", "echo", tripled))
    with Client(server.url) as fnrt:
        assert fnrt.invoke("echo", x=X).version == second
        pinned = fnrt.invoke("echo", x=X, version=first)
        with pytest.raises(NotFoundError, match="has no version 'v-nope'") as info:
            fnrt.invoke("echo", x=X, version="v-nope")
    assert pinned.version == first
    np.testing.assert_array_equal(pinned["y"], X * 2)
    assert info.value.status == 404


def test_a_sticky_key_keeps_its_version_during_a_split(tmp_path: Path, server: LiveServer) -> None:
    first = server.call(server.registry.get("echo")).version.version
    tripled = ECHO_HANDLER.replace("self.scale = 2.0", "self.scale = 3.0")
    second = _deploy(server, write_function(tmp_path / "v2", "echo", tripled))
    with Client(server.url) as fnrt:
        fnrt.set_traffic("echo", {first: 50, second: 50})
        seen = {
            key: {fnrt.invoke("echo", x=X, sticky=key).version for _ in range(5)}
            for key in (f"user-{i}" for i in range(12))
        }
    assert all(len(versions) == 1 for versions in seen.values()), seen
    assert set().union(*seen.values()) == {first, second}  # 12 keys: both halves drawn


def test_errors_are_typed_and_carry_the_servers_words(server: LiveServer) -> None:
    with Client(server.url) as fnrt:
        with pytest.raises(NotFoundError, match="'missing' is not deployed") as missing:
            fnrt.invoke("missing", x=X)
        with pytest.raises(InvalidInputError, match="x") as invalid:
            fnrt.invoke("echo", x=np.ones((2, 5), np.float32))
        with pytest.raises(BadRequestError, match="high, normal or low"):
            fnrt.invoke("echo", x=X, priority="urgent")  # type: ignore[arg-type]
    assert missing.value.status == 404 and invalid.value.status == 422
    assert invalid.value.error_id is None or len(invalid.value.error_id) > 0
    assert str(invalid.value).startswith("422: ")


def test_a_deadline_passed_in_the_queue_is_a_deadline_error(
    tmp_path: Path, server: LiveServer
) -> None:
    _deploy(server, write_function(tmp_path / "src", "gated", GATED, GATED_MANIFEST))
    release = gate("release")
    with Client(server.url) as fnrt:
        first = threading.Thread(target=fnrt.invoke, args=("gated",), kwargs={"x": X})
        first.start()
        scheduler = server.call(server.registry.get("gated"))
        # running, nothing queued
        wait_until(lambda: sched.activity(scheduler).busy and scheduler.batcher.queued == 0)
        try:
            with pytest.raises(DeadlineError) as info:
                fnrt.invoke("gated", x=X, deadline_s=0.2)
        finally:
            release.set()
            first.join(30)
    assert info.value.status == 504


def test_a_full_queue_is_retried_after_retry_after(tmp_path: Path, server: LiveServer) -> None:
    _deploy(server, write_function(tmp_path / "src", "gated", GATED, GATED_MANIFEST))
    release = gate("release")
    waits: list[float] = []
    scheduler = server.call(server.registry.get("gated"))

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        release.set()  # the queue drains while the client waits
        wait_until(lambda: scheduler.batcher.queued == 0)

    with Client(server.url, sleep=sleep) as fnrt, Client(server.url, retry=NO_RETRY) as other:
        busy = [
            threading.Thread(target=other.invoke, args=("gated",), kwargs={"x": X})
            for _ in range(2)
        ]
        busy[0].start()
        # running, nothing queued
        wait_until(lambda: sched.activity(scheduler).busy and scheduler.batcher.queued == 0)
        busy[1].start()
        wait_until(lambda: scheduler.batcher.queued == 1)
        with pytest.raises(OverloadedError) as refused:
            fnrt.invoke("gated", x=X, idempotent=False)  # never sent twice
        assert waits == []
        result = fnrt.invoke("gated", x=X)  # 429, waits as told, then answered
        for thread in busy:
            thread.join(30)
    assert refused.value.status == 429 and refused.value.retry_after_s == 1.0
    assert waits == [1.0]
    np.testing.assert_array_equal(result["y"], X)


def test_a_server_that_is_not_there_is_unreachable_after_the_retries() -> None:
    waits: list[float] = []
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url, retry=RetryPolicy(attempts=3), sleep=waits.append) as fnrt:
        with pytest.raises(Unreachable, match="cannot reach the fnrt server"):
            fnrt.invoke("echo", x=X)
        assert not fnrt.ready()
    assert len(waits) == 2
    with Client(url, retry=NO_RETRY, sleep=waits.append) as fnrt, pytest.raises(FnrtError):
        fnrt.list()  # (what the client page says to catch for both kinds)
    assert len(waits) == 2


def test_streamed_answers_raise_the_typed_error_before_any_body(
    server: LiveServer, tmp_path: Path
) -> None:
    missing_job, out = "0" * 25, tmp_path / "out"
    out.mkdir()
    with Client(server.url) as fnrt:
        with pytest.raises(NotFoundError, match="'missing' is not deployed"):
            list(fnrt.generate("missing", {"prompt": ["hi"]}))
        with pytest.raises(NotFoundError, match=missing_job):
            list(fnrt.job_results(missing_job))
        with pytest.raises(NotFoundError, match=missing_job):
            fnrt.download_job_result(missing_job, out / "results.npz")
    assert list(out.iterdir()) == []  # nothing written, not even a part


def test_the_async_client_answers_many_calls_at_once(server: LiveServer) -> None:
    async def main() -> list[np.ndarray]:
        async with AsyncClient(server.url) as fnrt:
            assert await fnrt.ready()
            results = await asyncio.gather(*(fnrt.invoke("echo", x=X + i) for i in range(16)))
            with pytest.raises(NotFoundError):
                await fnrt.invoke("missing", x=X)
            assert (await fnrt.describe("echo"))["name"] == "echo"
            assert [f["name"] for f in await fnrt.list()] == ["echo"]
            assert list((await fnrt.versions("echo"))["traffic"].values()) == [100]
            return [r["y"] for r in results]

    outputs = asyncio.run(main())
    for i, y in enumerate(outputs):
        np.testing.assert_array_equal(y, (X + i) * 2)
