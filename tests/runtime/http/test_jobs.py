"""Asynchronous jobs over a real socket: submit, follow, results, cancel, bad input."""

from __future__ import annotations

import asyncio
import io
import json
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import httpx
import msgpack
import msgpack_numpy
import numpy as np
import pytest

from fnrt.client import Client
from fnrt.functions.errors import StoreError
from fnrt.functions.tensors import coerce_request
from fnrt.runtime.gateway import Target
from fnrt.runtime.jobs.board import JobBoard, JobSpec, new_id
from support import (
    COUNTER_HANDLER,
    COUNTER_MANIFEST,
    LiveServer,
    error_of,
    gate,
    live_server,
    wait_until,
    write_function,
)

#: A handler that waits at the gate "job" before every batch (a test opens it).
GATED_HANDLER = """
import fnrt_test_gates

class Echo:  # gated
    def load(self, artifacts, device):
        pass

    def __call__(self, batch):
        fnrt_test_gates.gate("job").wait(30)
        return [{"y": r["x"] * 2} for r in batch]
"""

#: A handler that fails a whole batch when any record in it has x[0, 0] == 5.
FUSSY_HANDLER = """
class Echo:
    def load(self, artifacts, device):
        pass

    def __call__(self, batch):
        if any(r["x"][0, 0] == 5 for r in batch):
            raise ValueError("bad input: x[0, 0] is 5")
        return [{"y": r["x"] * 2} for r in batch]
"""

#: Loads unless the gate "broken" is open; then every load fails.
BREAKABLE_HANDLER = """
import fnrt_test_gates

class Echo:
    def load(self, artifacts, device):
        if fnrt_test_gates.gate("broken").is_set():
            raise RuntimeError("the weights are gone")

    def __call__(self, batch):
        return [{"y": r["x"] * 2} for r in batch]
"""

ENDED = ("done", "failed", "cancelled")


def _deploy(
    server: LiveServer, tmp: Path, name: str, handler: str | None = None, **fields: Any
) -> Any:
    kwargs: dict[str, Any] = {"max_batch_size": 32, "max_queue": 1024, **fields}
    if handler is not None:
        kwargs["handler"] = handler
    folder = write_function(tmp / "src", name, **kwargs)
    return server.deploy(folder)


@pytest.fixture
def server(tmp_path: Path):
    with live_server(tmp_path, isolation="thread", job_poll_interval_s=0.1) as srv:
        _deploy(srv, tmp_path, "echo")
        yield srv


def _wait(c: httpx.Client, location: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        status = c.get(location).json()
        if status["state"] in ENDED:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


def _lines(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.text.splitlines()]


def _records(n: int) -> list[dict[str, Any]]:
    return [{"x": [[float(i), float(i % 7), -1.5, 0.25]]} for i in range(n)]


def _invoked(server: LiveServer, records: list[dict[str, Any]], sample: int = 200) -> list[Any]:
    """Each record invoked on its own, as a user would without jobs: every one through
    the node's invoke path (the gateway), and a sample of them over HTTP as well."""

    async def each() -> list[Any]:
        clients = asyncio.Semaphore(256)  # within the function's queue bound

        async def one(record: dict[str, Any]) -> Any:
            gateway = server.node.gateway
            async with clients:
                scheduler = await gateway.choose(Target("echo"))
                inputs = coerce_request(scheduler.version.manifest.inputs, record)
                served = await gateway.submit(gateway.call(scheduler, inputs))
            return {k: v.tolist() for k, v in served.outputs.items()}

        return await asyncio.gather(*(one(r) for r in records))

    outputs = server.call(each(), timeout_s=120)
    with server.client() as c:
        for index in range(0, len(records), max(len(records) // sample, 1)):
            r = c.post("/v1/functions/echo/invoke", json=records[index])
            assert r.status_code == 200 and r.json() == outputs[index], index
    return outputs


def test_ten_thousand_inline_records_equal_invoking_each(server: LiveServer) -> None:
    records = _records(10_000)
    with server.client() as c:
        r = c.post("/v1/functions/echo/jobs", json={"records": records, "chunk_records": 1000})
        assert r.status_code == 202, r.text
        location = r.headers["location"]
        assert location == f"/v1/jobs/{r.json()['id']}"
        assert r.json()["state"] == "queued"
        assert r.json()["progress"]["records_total"] == 10_000
        status = _wait(c, location)
        assert status["state"] == "done"
        assert status["progress"] == {
            "records_total": 10_000,
            "records_done": 10_000,
            "records_failed": 0,
            "chunks_total": 10,
            "chunks_done": 10,
        }
        assert status["version"] == server.call(server.registry.route("echo")).version.version
        assert status["timings"]["running_s"] > 0
        result = c.get(f"{location}/result")
    assert result.status_code == 200
    assert result.headers["content-type"].startswith("application/x-ndjson")
    lines = _lines(result)
    assert [line["index"] for line in lines] == list(range(10_000))
    assert [line["outputs"] for line in lines] == _invoked(server, records)


def test_a_record_file_in_the_store_equals_the_inline_job(server: LiveServer) -> None:
    records = _records(10_000)
    store = server.node.repository.store
    store.put("inputs/batch.jsonl", b"".join(json.dumps(r).encode() + b"\n" for r in records))
    with server.client() as c:
        by_key = c.post("/v1/functions/echo/jobs", json={"input": "inputs/batch.jsonl"})
        by_uri = c.post(
            "/v1/functions/echo/jobs", params={"input": f"{store.uri}/inputs/batch.jsonl"}
        )
        inline = c.post("/v1/functions/echo/jobs", json={"records": records})
        for r in (by_key, by_uri, inline):
            assert r.status_code == 202, r.text
        results = []
        for r in (by_key, by_uri, inline):
            assert _wait(c, r.headers["location"])["state"] == "done"
            results.append(c.get(r.headers["location"] + "/result").content)
    assert by_key.json()["source"] == "inputs/batch.jsonl"
    assert results[0] == results[1] == results[2]
    assert len(results[0].splitlines()) == 10_000


def test_record_files_in_the_body_and_results_in_each_format(server: LiveServer) -> None:
    x = np.arange(40, dtype=np.float32).reshape(10, 1, 4)
    npz = io.BytesIO()
    np.savez(npz, x=x)
    stream = b"".join(msgpack.packb({"x": row}, default=msgpack_numpy.encode) for row in x)
    with server.client() as c:
        jobs = [
            c.post(
                "/v1/functions/echo/jobs",
                content=npz.getvalue(),
                headers={"content-type": "application/x-npz"},
                params={"chunk_records": 3},
            ),
            c.post(
                "/v1/functions/echo/jobs",
                content=stream,
                headers={"content-type": "application/vnd.fnrt.records+msgpack"},
            ),
        ]
        for r in jobs:
            assert r.status_code == 202, r.text
            assert _wait(c, r.headers["location"])["state"] == "done"
        assert jobs[0].json()["progress"]["chunks_total"] == 4
        location = jobs[0].headers["location"] + "/result"
        as_npz = c.get(location, headers={"accept": "application/x-npz"})
        as_msgpack = c.get(location, headers={"accept": "application/msgpack"})
        refused = c.get(location, headers={"accept": "text/csv"})
    assert as_npz.headers["content-disposition"].endswith('.npz"')
    np.testing.assert_array_equal(np.load(io.BytesIO(as_npz.content))["y"], x * 2)
    unpacker = msgpack.Unpacker(io.BytesIO(as_msgpack.content), object_hook=msgpack_numpy.decode)
    results = list(unpacker)
    assert [r["index"] for r in results] == list(range(10))
    np.testing.assert_array_equal(results[9]["outputs"]["y"], x[9] * 2)
    assert refused.status_code == 415


def test_the_client_submits_follows_and_reads_results(server: LiveServer, tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _records(50)))
    sent: list[int] = []
    with Client(server.url) as fnrt:
        inline = fnrt.submit_job("echo", [{"x": np.ones((1, 4), np.float32)}] * 5)
        from_file = fnrt.submit_job("echo", input=path, chunk_records=20, progress=sent.append)
        assert sum(sent) == path.stat().st_size
        seen: list[str] = []
        status = fnrt.wait_job(
            from_file["id"], poll_s=0.05, on_status=lambda s: seen.append(s["state"])
        )
        assert status["state"] == "done" and seen[-1] == "done"
        results = list(fnrt.job_results(from_file["id"]))
        assert len(results) == 50
        np.testing.assert_array_equal(results[3]["outputs"]["y"], [[6.0, 6.0, -3.0, 0.5]])
        fnrt.wait_job(inline["id"], poll_s=0.05)
        fnrt.download_job_result(inline["id"], tmp_path / "out.npz")
        np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["y"], np.full((5, 1, 4), 2.0))
        listed = fnrt.jobs(function="echo")["jobs"]
        assert {j["id"] for j in listed} == {inline["id"], from_file["id"]}


def _npz_patched(flags: int = 0, method: int | None = None) -> bytes:
    """An .npz of three records whose zip headers say its member is encrypted (``flags``
    1) or compressed by a method zipfile lacks (``method``): what zipfile raises for
    each is not one of its usual errors (RuntimeError, NotImplementedError)."""
    out = io.BytesIO()
    np.savez(out, x=np.ones((3, 1, 4), np.float32))
    data = bytearray(out.getvalue())
    for signature, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = data.find(signature)
        data[at + flags_at] |= flags
        if method is not None:
            struct.pack_into("<H", data, at + flags_at + 2, method)
    return bytes(data)


NPZ = {"content-type": "application/x-npz"}


@pytest.mark.parametrize(
    ("body", "headers", "status", "words", "fields"),
    [
        (b'{"records": [{"x": [[1,2,3,4]]}, {"x": [[1,2]]}]}', {}, 422, "record 1", {"record": 1}),
        (_npz_patched(flags=1), NPZ, 400, "not a readable .npz", {}),
        (_npz_patched(method=99), NPZ, 400, "not a readable .npz", {}),
        (
            b'{"x": [[1,2,3,4]]}\n{"x": [[1,2,3,4]]}\n{"x": [[1,2,3,4]]\n',
            {"content-type": "application/x-ndjson"},
            400,
            "record 2 (line 3): not valid JSON",
            {"record": 2, "line": 3},
        ),
        (
            b'{"x": [[1,2,3,4]]}\n{"w": [[1,2,3,4]]}\n',
            {"content-type": "application/x-ndjson"},
            422,
            "record 1 (line 2): missing input 'x'",
            {"record": 1, "line": 2, "input": "x"},
        ),
        (b'{"records": []}', {}, 400, "no records", {}),
        (b'{"records": {"x": 1}}', {}, 400, "list of input maps", {}),
        (b"{}", {}, 400, "a job needs records", {}),
        (b'{"input": "inputs/none.jsonl"}', {}, 404, "no object", {}),
        (b'{"input": "../../etc/passwd.jsonl"}', {}, 400, "invalid store key", {}),
        (b'{"input": "s3://elsewhere/in.jsonl"}', {}, 400, "not in this server's store", {}),
        (b'{"input": "inputs/in.csv"}', {}, 400, ".jsonl, .msgpack or .npz", {}),
        (b'{"input": "jobs/x/in/000000.msgpack"}', {}, 400, "fnrt's own part", {}),
        (b'{"records": [{"x": [[1,2,3,4]]}], "chunk_records": 0}', {}, 400, "chunk_records", {}),
        (b'{"records": [{"x": [[1,2,3,4]]}], "webhook": "ftp://x"}', {}, 400, "webhook", {}),
        (b"x" * 10, {"content-type": "text/csv"}, 415, "Content-Type", {}),
    ],
)
def test_bad_submits_are_refused_naming_what(
    server: LiveServer,
    body: bytes,
    headers: dict[str, str],
    status: int,
    words: str,
    fields: dict[str, Any],
) -> None:
    headers = {"content-type": "application/json", **headers}
    with server.client() as c:
        r = c.post("/v1/functions/echo/jobs", content=body, headers=headers)
        assert r.status_code == status, r.text
        error = error_of(r)
        assert words in error["error"]
        assert {k: error[k] for k in fields} == fields
        assert c.get("/v1/jobs").json()["jobs"] == []  # nothing was queued
        assert c.post("/v1/functions/echo/invoke", json={"x": [[1, 2, 3, 4]]}).status_code == 200


def test_unknown_functions_jobs_and_oversized_files(tmp_path: Path) -> None:
    with live_server(tmp_path, isolation="thread", max_job_bytes=2048) as server:
        _deploy(server, tmp_path, "echo")
        with server.client() as c:
            r = c.post("/v1/functions/nope/jobs", json={"records": [{"x": [[1, 2, 3, 4]]}]})
            assert r.status_code == 404 and "nope" in error_of(r)["error"]
            assert c.get("/v1/jobs/" + "0" * 25).status_code == 404
            assert c.get("/v1/jobs/not-an-id").status_code == 400
            assert c.delete("/v1/jobs/" + "f" * 25).status_code == 404
            big = b'{"x": [[1,2,3,4]]}\n' * 200
            r = c.post(
                "/v1/functions/echo/jobs",
                content=big,
                headers={"content-type": "application/x-ndjson"},
            )
            assert r.status_code == 413
            server.node.repository.store.put("inputs/big.jsonl", big)
            r = c.post("/v1/functions/echo/jobs", json={"input": "inputs/big.jsonl"})
            assert r.status_code == 413 and "inputs/big.jsonl" in error_of(r)["error"]
            assert list((tmp_path / "cache" / "uploads").glob("job.*")) == []  # spools removed


def test_a_record_that_fails_fails_alone_with_its_reason(tmp_path: Path) -> None:
    with live_server(tmp_path, isolation="thread", job_poll_interval_s=0.1) as server:
        _deploy(server, tmp_path, "flaky", handler=FUSSY_HANDLER, max_batch_size=16)
        records = [{"x": [[5.0 if i in (3, 17) else 100.0 + i, 0, 0, 0]]} for i in range(40)]
        with server.client() as c:
            r = c.post("/v1/functions/flaky/jobs", json={"records": records, "chunk_records": 20})
            status = _wait(c, r.headers["location"])
            lines = _lines(c.get(r.headers["location"] + "/result"))
    assert status["state"] == "done"
    assert status["progress"]["records_failed"] == 2
    failed = {line["index"]: line["error"] for line in lines if "error" in line}
    assert set(failed) == {3, 17}
    assert "bad input" in failed[3]["message"] and failed[3]["type"] == "HandlerFailed"
    assert lines[4]["outputs"] == {"y": [[208.0, 0.0, 0.0, 0.0]]}


def test_cancel_stops_the_job_at_the_next_chunk(tmp_path: Path) -> None:
    with live_server(
        tmp_path, isolation="thread", job_poll_interval_s=0.05, job_chunks=1
    ) as server:
        _deploy(server, tmp_path, "gated", handler=GATED_HANDLER, max_batch_size=8)
        with server.client() as c:
            r = c.post(
                "/v1/functions/gated/jobs",
                json={"records": _records(50), "chunk_records": 10},
            )
            location = r.headers["location"]
            wait_until(lambda: c.get(location).json()["state"] == "running")
            cancelled = c.delete(location)
            assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
            assert c.get(location + "/result").status_code == 200  # cancelled is an end
            gate("job").set()
            wait_until(lambda: server.node.jobs.running == 0)
            time.sleep(0.3)  # several polls: no other chunk starts
            status = c.get(location).json()
            assert c.delete(location).status_code == 409
            lines = _lines(c.get(location + "/result"))
    assert status["state"] == "cancelled"
    assert status["progress"]["chunks_done"] <= 1
    assert len(lines) == 50
    not_run = [line for line in lines if line.get("error", {}).get("type") == "NotRun"]
    assert len(not_run) >= 40 and "cancelled" in not_run[-1]["error"]["message"]


def test_results_wait_for_the_end(tmp_path: Path) -> None:
    with live_server(tmp_path, isolation="thread", job_poll_interval_s=0.05) as server:
        _deploy(server, tmp_path, "gated", handler=GATED_HANDLER, max_batch_size=8)
        with server.client() as c:
            r = c.post("/v1/functions/gated/jobs", json={"records": _records(8)})
            early = c.get(r.headers["location"] + "/result")
            gate("job").set()
            _wait(c, r.headers["location"])
    assert early.status_code == 409
    assert "its results come when it ends" in error_of(early)["error"]


def test_a_function_at_zero_is_woken_by_a_queued_job(server: LiveServer) -> None:
    with server.client() as c:
        assert c.post("/v1/functions/echo/invoke", json={"x": [[1, 2, 3, 4]]}).status_code == 200
        assert c.post("/v1/functions/echo/unload").json()["unloaded"] is True
        assert c.get("/v1/functions/echo").json()["instance"]["state"] == "cold"
        r = c.post("/v1/functions/echo/jobs", json={"records": _records(100)})
        assert _wait(c, r.headers["location"])["state"] == "done"
        assert c.get("/v1/functions/echo").json()["instance"]["state"] == "warm"


def _webhook() -> tuple[HTTPServer, list[dict[str, Any]]]:
    """A webhook receiver on 127.0.0.1, serving in a thread, and the bodies it got."""
    got: list[dict[str, Any]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    hook = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    return hook, got


def test_a_cancelled_jobs_webhook_is_told(tmp_path: Path) -> None:
    hook, got = _webhook()
    try:
        with live_server(tmp_path, isolation="thread", job_poll_interval_s=0.05) as server:
            _deploy(server, tmp_path, "gated", handler=GATED_HANDLER, max_batch_size=8)
            url = f"http://127.0.0.1:{hook.server_address[1]}/ended"
            with server.client() as c:
                r = c.post(
                    "/v1/functions/gated/jobs", json={"records": _records(30), "webhook": url}
                )
                location = r.headers["location"]
                assert c.delete(location).status_code == 200
                wait_until(lambda: len(got) == 1)
                gate("job").set()
    finally:
        hook.shutdown()
    assert got[0]["id"] == r.json()["id"] and got[0]["state"] == "cancelled"


def test_the_webhook_gets_the_final_status_and_metrics_count_queued_records(
    tmp_path: Path,
) -> None:
    hook, got = _webhook()
    try:
        with live_server(tmp_path, isolation="thread", job_poll_interval_s=0.05) as server:
            _deploy(server, tmp_path, "gated", handler=GATED_HANDLER, max_batch_size=8)
            url = f"http://127.0.0.1:{hook.server_address[1]}/done"
            with server.client() as c:
                r = c.post(
                    "/v1/functions/gated/jobs", json={"records": _records(30), "webhook": url}
                )
                wait_until(
                    lambda: (
                        'fnrt_job_queued_records{function="gated"} 30.0' in c.get("/metrics").text
                    )
                )
                assert "fnrt_job_chunks_running 1.0" in c.get("/metrics").text
                gate("job").set()
                _wait(c, r.headers["location"])
                wait_until(lambda: len(got) == 1)
                wait_until(lambda: "fnrt_job_queued_records{" not in c.get("/metrics").text)
    finally:
        hook.shutdown()
    assert got[0]["id"] == r.json()["id"] and got[0]["state"] == "done"
    assert got[0]["progress"]["records_done"] == 30


def test_a_version_that_does_not_load_fails_no_record_until_its_last_try(
    tmp_path: Path,
) -> None:
    with live_server(tmp_path, isolation="thread", job_poll_interval_s=0.05) as server:
        _deploy(server, tmp_path, "fragile", handler=BREAKABLE_HANDLER)
        with server.client() as c:
            c.post("/v1/functions/fragile/unload")
            assert c.get("/v1/functions/fragile").json()["instance"]["state"] == "cold"
            gate("broken").set()
            r = c.post("/v1/functions/fragile/jobs", json={"records": _records(10)})
            status = _wait(c, r.headers["location"])
            lines = _lines(c.get(r.headers["location"] + "/result"))
    assert status["state"] == "failed" and status["reason"] == "every record failed"
    error = lines[0]["error"]
    assert error["type"] == "ChunkFailed"
    assert "tried 3 times" in error["message"] and "the weights are gone" in error["message"]


def test_a_draining_node_gives_its_chunks_back_at_once(tmp_path: Path) -> None:
    with live_server(tmp_path, isolation="thread", job_poll_interval_s=0.05) as server:
        _deploy(server, tmp_path, "gated", handler=GATED_HANDLER, max_batch_size=8)
        with server.client() as c:
            r = c.post("/v1/functions/gated/jobs", json={"records": _records(8)})
            job = r.json()["id"]
            wait_until(lambda: server.node.jobs.running == 1)
            server.node.lifecycle.drain()
            server.call(server.node.drain(0.3))  # its batch in the handler is cut off
            assert server.node.jobs.running == 0
            lease = server.node.jobs.board.lease(job, 0)
            assert lease is not None and lease.until_unix_s == 0.0
            assert (lease.attempt, lease.reason) == (0, "its node stopped")
            assert c.get(r.headers["location"]).json()["state"] == "running"
            gate("job").set()


def test_a_job_whose_last_node_died_before_ending_it_is_ended_by_another(
    server: LiveServer,
) -> None:
    board = server.node.jobs.board
    dead = JobBoard(board.store, "dead-node")  # finishes every chunk, dies before ending
    spec = JobSpec(new_id(time.time()), "echo", "v-1", 20, 10, time.time())
    with server.client() as c:
        server.call(server.node.jobs.close())  # so the live node takes no chunk itself
        dead.create(spec, [{"x": np.ones((1, 4), np.float32)} for _ in range(20)])
        for _ in range(2):
            lease = dead.claim(spec.id, 30)
            assert lease is not None
            dead.finish_chunk(lease, [{"outputs": {"y": np.ones((1, 4))}}] * 10)
        assert c.get(f"/v1/jobs/{spec.id}").json()["state"] == "queued"
        server.loop.call_soon_threadsafe(server.node.jobs.start)  # type: ignore[union-attr]
        status = _wait(c, f"/v1/jobs/{spec.id}")
    assert status["state"] == "done" and status["progress"]["records_done"] == 20


def test_a_submit_refused_halfway_through_its_file_leaves_nothing_stored(
    server: LiveServer,
) -> None:
    lines = [json.dumps({"x": [[i, 0, 0, 0]]}) for i in range(2500)]
    lines[2100] = '{"x": [[1, 2]]}'  # after two chunks of 1000 were written
    with server.client() as c:
        r = c.post(
            "/v1/functions/echo/jobs",
            content="\n".join(lines).encode(),
            headers={"content-type": "application/x-ndjson"},
        )
    assert r.status_code == 422 and error_of(r)["record"] == 2100
    assert server.node.repository.store.list("jobs/") == []
    assert server.node.repository.store.list("jobqueue/") == []


def test_a_generative_functions_records_get_whole_answers(tmp_path: Path) -> None:
    with live_server(tmp_path, isolation="thread", job_poll_interval_s=0.05) as server:
        folder = write_function(
            tmp_path / "src",
            "counter",
            COUNTER_HANDLER,
            COUNTER_MANIFEST,
            max_active=4,
            max_queue=64,
            mode="thread",
        )
        server.deploy(folder)
        with server.client() as c:
            records = [{"x": [start]} for start in (1, 10, 100)]
            r = c.post("/v1/functions/counter/jobs", json={"records": records})
            assert r.status_code == 202, r.text
            status = _wait(c, r.headers["location"])
            lines = _lines(c.get(r.headers["location"] + "/result"))
    assert status["state"] == "done" and status["progress"]["records_failed"] == 0
    for line, start in zip(lines, (1, 10, 100), strict=True):
        counted = line["outputs"]["n"]  # the function's default: 50 new tokens, joined
        assert counted == list(range(start + 1, start + 51)), line


def _body(fmt: str, records: list[dict[str, Any]]) -> tuple[bytes, str]:
    if fmt == "inline":
        return json.dumps({"records": records}).encode(), "application/json"
    if fmt == "jsonl":
        return "\n".join(json.dumps(r) for r in records).encode(), "application/x-ndjson"
    if fmt == "msgpack":
        packed = (
            msgpack.packb({"x": np.asarray(r["x"], np.float32)}, default=msgpack_numpy.encode)
            for r in records
        )
        return b"".join(packed), "application/vnd.fnrt.records+msgpack"
    out = io.BytesIO()
    np.savez(out, x=np.asarray([r["x"][0] for r in records], np.float32)[:, None, :])
    return out.getvalue(), "application/x-npz"


@pytest.mark.parametrize("fmt", ["inline", "jsonl", "msgpack", "npz"])
def test_a_job_of_too_many_chunks_is_refused_at_once_and_writes_nothing(
    server: LiveServer, tmp_path: Path, fmt: str
) -> None:
    body, media = _body(fmt, _records(10_001))  # one chunk a record: 10,001 chunks
    puts = server.node.repository.store.requests
    before = puts["PutObject"]
    with server.client() as c:
        r = c.post(
            "/v1/functions/echo/jobs",
            params={"chunk_records": 1},
            content=body,
            headers={"content-type": media},
        )
    assert r.status_code == 400, error_of(r)
    assert "at most 10000 chunks" in error_of(r)["error"]
    assert puts["PutObject"] == before  # was 10,000 chunks written, then removed (4.9 s)
    jobs = tmp_path / "store" / "jobs"
    assert not jobs.exists() or not any(jobs.iterdir())  # was: an empty jobs/<id>/in/
    assert server.node.repository.store.list("jobqueue/") == []


def test_a_done_jobs_results_that_the_store_lost_are_an_error_not_made_up(
    server: LiveServer, tmp_path: Path
) -> None:
    """Results the store cannot give back (lost, or the store failing) answer an error
    before the first byte: never records said not to have run, with a 200."""
    with server.client() as c:
        r = c.post("/v1/functions/echo/jobs", json={"records": _records(4), "chunk_records": 2})
        assert r.status_code == 202, r.text
        location = r.headers["location"]
        assert _wait(c, location)["state"] == "done"
        job = location.rsplit("/", 1)[1]
        server.node.jobs.board.store.delete(f"jobs/{job}/out/000000")
        r = c.get(f"{location}/result")
        assert r.status_code == 503, r.text
        assert error_of(r)["chunk"] == 0 and "gone from the store" in error_of(r)["error"]
        assert c.post("/v1/functions/echo/invoke", json={"x": [[1, 2, 3, 4]]}).status_code == 200


def test_a_page_of_one_functions_jobs_is_full_whatever_came_between(
    server: LiveServer, tmp_path: Path
) -> None:
    _deploy(server, tmp_path, "other")
    ids = {}
    with server.client() as c:
        for name in ("other", "other", "echo", "other", "echo"):
            r = c.post(f"/v1/functions/{name}/jobs", json={"records": _records(2)})
            ids.setdefault(name, []).append(r.json()["id"])
        page = c.get("/v1/jobs", params={"function": "echo", "limit": 2}).json()
        assert {j["id"] for j in page["jobs"]} == set(ids["echo"])  # whatever came first
        first = c.get("/v1/jobs", params={"function": "other", "limit": 2}).json()
        assert len(first["jobs"]) == 2 and first["next"]
        rest = c.get("/v1/jobs", params={"function": "other", "after": first["next"]}).json()
        assert len(rest["jobs"]) == 1 and rest["next"] is None
        assert {j["id"] for j in first["jobs"] + rest["jobs"]} == set(ids["other"])


def test_npz_results_past_the_job_bound_are_refused_and_leave_no_spool(tmp_path: Path) -> None:
    """An .npz answer is built whole: within --max-job-bytes (413 past it, the streamed
    formats still whole), from a spool file removed once sent."""
    with live_server(
        tmp_path, isolation="thread", job_poll_interval_s=0.05, max_job_bytes=2048
    ) as server:
        _deploy(server, tmp_path, "echo")
        with server.client() as c:
            small = c.post("/v1/functions/echo/jobs", json={"records": _records(10)})
            big = c.post("/v1/functions/echo/jobs", json={"records": _records(200)})
            for r in (small, big):
                assert _wait(c, r.headers["location"])["state"] == "done"
            npz = {"accept": "application/x-npz"}
            got = c.get(small.headers["location"] + "/result", headers=npz)
            assert got.status_code == 200
            assert np.load(io.BytesIO(got.content))["y"].shape == (10, 1, 4)
            refused = c.get(big.headers["location"] + "/result", headers=npz)
            assert refused.status_code == 413 and "3200 bytes" in error_of(refused)["error"]
            assert len(_lines(c.get(big.headers["location"] + "/result"))) == 200
            wait_until(lambda: not list((tmp_path / "cache" / "uploads").glob("job.*")))


def test_a_submit_that_cannot_be_published_or_is_cancelled_leaves_nothing_stored(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its chunks written, a submit whose job cannot be queued (the store fails) answers
    503 and removes them; one cancelled while its records are written (the server
    stopping) leaves none either: no chunks that nothing queues or cleans."""
    store = server.node.jobs.board.store
    put = store.put

    def failing(key: str, data: bytes, **kw: Any) -> Any:
        if key.endswith("/state.json"):
            raise StoreError("503 SlowDown")
        return put(key, data, **kw)

    body = {"records": _records(5), "chunk_records": 2}
    with server.client() as c:
        monkeypatch.setattr(store, "put", failing)
        r = c.post("/v1/functions/echo/jobs", json=body)
        assert r.status_code == 503, r.text
        assert store.list("jobs/") == [] and store.list("jobqueue/") == []

        writing, release, discarded = threading.Event(), threading.Event(), threading.Event()

        def slow(key: str, data: bytes, **kw: Any) -> Any:
            if "/in/" in key:  # a chunk: the cancel comes while the first is written
                writing.set()
                release.wait(10)
            return put(key, data, **kw)

        board = server.node.jobs.board
        discard = board.discard

        def watched(job: str) -> None:
            try:
                discard(job)
            finally:
                discarded.set()

        monkeypatch.setattr(store, "put", slow)
        monkeypatch.setattr(board, "discard", watched)
        from starlette.requests import Request

        from fnrt.runtime.http.jobs import submit

        raw = json.dumps(body).encode()

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": raw, "more_body": False}

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/functions/echo/jobs",
            "headers": [(b"content-type", b"application/json")],
            "query_string": b"",
            "path_params": {"name": "echo"},
            "app": server.app,
        }

        async def cancelled() -> None:
            task = asyncio.ensure_future(submit(Request(scope, receive)))
            assert await asyncio.to_thread(writing.wait, 10)  # its first chunk under way
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        server.call(cancelled())
        release.set()
        assert discarded.wait(10), "the cancelled submit's chunks were not removed"
        monkeypatch.setattr(store, "put", put)
        assert store.list("jobs/") == [] and store.list("jobqueue/") == []
        assert c.post("/v1/functions/echo/jobs", json=body).status_code == 202
