"""Generative functions over real HTTP: streamed (SSE, msgpack frames) and whole
answers, sequences joining between steps, cancellation, limits and bad input."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import msgpack_numpy
import orjson
import pytest

from fnrt.runtime import scheduler as sched
from fnrt.runtime.cli.main import main
from support import (
    COUNTER_HANDLER,
    COUNTER_MANIFEST,
    LiveServer,
    error_of,
    gates,
    live_server,
    wait_until,
    write_function,
)

FRAMES = "application/vnd.fnrt.frames+msgpack"


def deploy(srv: LiveServer, tmp: Path, name: str = "count", **fields: Any) -> None:
    values = {"max_active": 8, "max_queue": 64, "mode": "thread", **fields}
    folder = write_function(tmp / "src", name, COUNTER_HANDLER, COUNTER_MANIFEST, **values)
    assert main(["deploy", str(folder), "--server", srv.url, "-q"]) == 0


@pytest.fixture
def server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[LiveServer]:
    with live_server(tmp_path) as srv:
        deploy(srv, tmp_path)
        capsys.readouterr()
        yield srv


def url(srv: LiveServer, name: str = "count") -> str:
    return f"{srv.url}/v1/functions/{name}/generate"


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """(event, data) pairs of a Server-Sent Events stream."""
    import json

    kind, data = "message", ""
    for line in lines:
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line == "" and data:
            yield kind, json.loads(data)
            kind, data = "message", ""


def frames(body: bytes) -> list[dict[str, Any]]:
    out, at = [], 0
    while at < len(body):
        (size,) = struct.unpack(">I", body[at : at + 4])
        out.append(msgpack.unpackb(body[at + 4 : at + 4 + size], object_hook=msgpack_numpy.decode))
        at += 4 + size
    return out


def test_whole_answer_joins_every_chunk_with_usage(server: LiveServer) -> None:
    r = httpx.post(url(server), json={"x": [10], "parameters": {"max_new_tokens": 4}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["outputs"] == {"n": [11, 12, 13, 14], "text": ["11 12 13 14 "]}
    assert body["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["prompt_tokens"] == 1 and usage["completion_tokens"] == 4
    assert 0 <= usage["time_to_first_token_ms"] <= usage["total_ms"]
    assert r.headers["x-fnrt-function"] == "count" and r.headers["x-fnrt-version"]


def test_sse_stream_equals_the_whole_answer(server: LiveServer) -> None:
    body = {"x": [0], "parameters": {"max_new_tokens": 5, "stream": True}}
    with httpx.stream("POST", url(server), json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream"
        events = list(sse_events(r.iter_lines()))
    chunks = [data for kind, data in events if kind == "chunk"]
    assert [c["n"] for c in chunks] == [[1], [2], [3], [4], [5]]
    kind, done = events[-1]
    assert kind == "done" and done["finish_reason"] == "length"
    assert done["usage"]["completion_tokens"] == 5
    whole = httpx.post(url(server), json={"x": [0], "parameters": {"max_new_tokens": 5}}).json()
    assert "".join(c["text"][0] for c in chunks) == whole["outputs"]["text"][0]


def test_accept_header_asks_for_a_stream(server: LiveServer) -> None:
    headers = {"accept": "text/event-stream"}
    r = httpx.post(url(server), json={"x": [0], "parameters": {"until": 2}}, headers=headers)
    events = list(sse_events(iter(r.text.split("\n"))))
    assert [k for k, _ in events] == ["chunk", "chunk", "done"]
    assert events[-1][1]["finish_reason"] == "stop"  # the handler said done at 2


def test_msgpack_frames_stream(server: LiveServer) -> None:
    body = msgpack.packb({"x": [7], "parameters": {"max_new_tokens": 3}})
    headers = {"content-type": "application/msgpack", "accept": FRAMES}
    r = httpx.post(url(server), content=body, headers=headers)
    assert r.status_code == 200 and r.headers["content-type"] == FRAMES
    got = frames(r.content)
    assert [f["event"] for f in got] == ["chunk", "chunk", "chunk", "done"]
    assert [f["data"]["n"].tolist() for f in got[:3]] == [[8], [9], [10]]
    assert got[-1]["data"]["finish_reason"] == "length"


def test_msgpack_whole_answer(server: LiveServer) -> None:
    body = msgpack.packb({"x": [7], "parameters": {"max_new_tokens": 2}})
    r = httpx.post(url(server), content=body, headers={"content-type": "application/msgpack"})
    assert r.headers["content-type"] == "application/msgpack"
    answer = msgpack.unpackb(r.content)
    assert answer["outputs"]["text"] == [b"8 9 "] and answer["finish_reason"] == "length"


def test_invoke_of_a_generative_function_answers_its_whole_result(server: LiveServer) -> None:
    r = httpx.post(f"{server.url}/v1/functions/count/invoke", json={"x": [48]})
    assert r.status_code == 200
    assert r.json()["n"] == list(range(49, 99))  # the function's max_new_tokens: 50
    assert r.headers["x-fnrt-finish-reason"] == "length"


def test_sequences_join_a_running_batch_between_steps(server: LiveServer) -> None:
    gates.loads.clear()
    slow = {"x": [0], "parameters": {"max_new_tokens": 30, "delay_ms": 20, "stream": True}}
    with httpx.stream("POST", url(server), json=slow) as r:
        lines = r.iter_lines()
        seen = 0
        for kind, _ in sse_events(lines):
            seen += kind == "chunk"
            if seen == 3:
                break
        joined = httpx.post(url(server), json={"x": [100], "parameters": {"max_new_tokens": 3}})
        assert joined.json()["outputs"]["n"] == [101, 102, 103]
        rest = [data for kind, data in sse_events(lines) if kind == "chunk"]
    assert rest[-1]["n"] == [30]  # the first went on, untouched, to its end
    steps = list(gates.loads)
    grew = [i for i, s in enumerate(steps) if len(s) == 2]
    assert grew, steps
    before = steps[grew[0] - 1]
    assert len(before) == 1 and before[0][1] >= 2  # it was mid-sequence when the other joined


def test_a_disconnect_frees_its_slot_at_the_next_step(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv:
        deploy(srv, tmp_path, "one", max_active=1)
        long = {"x": [0], "parameters": {"max_new_tokens": 50, "delay_ms": 20, "stream": True}}
        with httpx.stream("POST", url(srv, "one"), json=long) as r:
            for kind, _ in sse_events(r.iter_lines()):
                if kind == "chunk":
                    break
        # the only slot was held by the stream just closed
        started = time.monotonic()
        r = httpx.post(url(srv, "one"), json={"x": [5], "parameters": {"max_new_tokens": 2}})
        assert r.json()["outputs"]["n"] == [6, 7]
        assert time.monotonic() - started < 0.8  # not after the 50 x 20 ms of the other

        def generation() -> dict[str, Any]:
            described = httpx.get(f"{srv.url}/v1/functions/one").json()
            return described["instance"]["generation"]  # type: ignore[no-any-return]

        wait_until(lambda: generation()["active_sequences"] == 0)
        assert generation()["ended"] == {"cancelled": 1, "length": 1}


def _described(srv: LiveServer, name: str) -> dict[str, Any]:
    return httpx.get(f"{srv.url}/v1/functions/{name}").json()["instance"]  # type: ignore[no-any-return]


def test_deadlines_end_a_running_sequence_and_refuse_a_queued_one(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv:
        deploy(srv, tmp_path, "one", max_active=1)
        slow = {"x": [0], "parameters": {"max_new_tokens": 50, "delay_ms": 20}}
        headers = {"x-fnrt-timeout-ms": "600"}
        results: dict[str, httpx.Response] = {}

        def first() -> None:
            results["first"] = httpx.post(url(srv, "one"), json=slow, headers=headers)

        thread = threading.Thread(target=first)
        thread.start()
        # it holds the only slot (no fixed sleep: on a loaded machine the first may
        # reach the server after the second)
        wait_until(lambda: _described(srv, "one")["generation"]["active_sequences"] == 1)
        queued = httpx.post(url(srv, "one"), json={"x": [0]}, headers={"x-fnrt-timeout-ms": "100"})
        thread.join()
        assert queued.status_code == 504, queued.text
        body = results["first"].json()
        assert body["finish_reason"] == "deadline"
        assert 0 < len(body["outputs"]["n"]) < 50


def test_a_full_queue_answers_429(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv:
        deploy(srv, tmp_path, "one", max_active=1, max_queue=1)
        slow = {"x": [0], "parameters": {"max_new_tokens": 50, "delay_ms": 30}}
        threads = [threading.Thread(target=httpx.post, args=(url(srv, "one"),),
                                    kwargs={"json": slow}) for _ in range(2)]  # fmt: skip
        threads[0].start()  # it runs (1.5 s)...
        wait_until(lambda: _described(srv, "one")["generation"]["active_sequences"] == 1)
        threads[1].start()  # ...and the second waits in the queue
        wait_until(lambda: _described(srv, "one")["queued"] == 1)
        r = httpx.post(url(srv, "one"), json={"x": [0]})
        for t in threads:
            t.join()
        assert r.status_code == 429 and "retry-after" in r.headers
        assert "queued" in error_of(r)["error"]


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"x": [0], "parameters": {"temperature": 1}}, 422, "not a parameter"),
        ({"x": [0], "parameters": {"max_new_tokens": 51}}, 422, "over this function's limit"),
        ({"x": [0], "parameters": {"max_new_tokens": 0}}, 422, "positive integer"),
        ({"x": [0], "parameters": {"until": [1]}}, 422, "a number, a string"),
        ({"x": [0], "parameters": "fast"}, 422, "must be a map"),
        ({"x": [0, 1]}, 422, "input"),  # a prompt of two tokens: over max_prompt_tokens
        ({"y": [0]}, 422, "x"),
    ],
)
def test_bad_input_is_refused_and_the_server_keeps_serving(
    server: LiveServer, body: dict[str, Any], status: int, says: str
) -> None:
    r = httpx.post(url(server), json=body)
    assert r.status_code == status, r.text
    assert says in error_of(r)["error"]
    ok = httpx.post(url(server), json={"x": [1], "parameters": {"max_new_tokens": 1}})
    assert ok.json()["outputs"]["n"] == [2]


def test_generate_on_a_function_that_is_not_generative(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv:
        folder = write_function(tmp_path / "src", "echo")
        assert main(["deploy", str(folder), "--server", srv.url, "-q"]) == 0
        r = httpx.post(url(srv, "echo"), json={"x": [[1, 2, 3, 4]]})
        assert r.status_code == 400 and "/invoke" in error_of(r)["error"]
        assert httpx.get(url(srv, "echo")).status_code == 405


def test_a_failing_step_fails_its_sequences_with_500(server: LiveServer) -> None:
    r = httpx.post(url(server), json={"x": [0], "parameters": {"fail_at": 1}})
    assert r.status_code == 500 and "failed at 1" in error_of(r)["error"]
    body = {"x": [0], "parameters": {"fail_at": 3, "stream": True}}
    with httpx.stream("POST", url(server), json=body) as r:
        assert r.status_code == 200  # the first chunks were sent already
        events = list(sse_events(r.iter_lines()))
    assert [k for k, _ in events] == ["chunk", "chunk", "error"]
    assert events[-1][1]["status"] == 500 and "failed at 3" in events[-1][1]["error"]
    ok = httpx.post(url(server), json={"x": [1], "parameters": {"max_new_tokens": 1}})
    assert ok.status_code == 200


def test_oip_generate_and_generate_stream(server: LiveServer) -> None:
    r = httpx.post(f"{server.url}/v2/models/count/generate", json={"x": 3, "max_new_tokens": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model_name"] == "count" and body["model_version"]
    assert body["text"] == "4 5 " and body["n"] == [4, 5]
    body = {"id": "req-1", "x": 3, "parameters": {"until": 5}}
    with httpx.stream("POST", f"{server.url}/v2/models/count/generate_stream", json=body) as r:
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        events = list(sse_events(r.iter_lines()))
    assert [data["n"] for _, data in events] == [4, 5]
    assert all(data["model_name"] == "count" and data["id"] == "req-1" for _, data in events)
    failing = {"x": 0, "fail_at": 2}
    with httpx.stream("POST", f"{server.url}/v2/models/count/generate_stream", json=failing) as r:
        events = list(sse_events(r.iter_lines()))
    assert events[0][1]["n"] == 1 and "failed at 2" in events[-1][1]["error"]
    bad = httpx.post(f"{server.url}/v2/models/count/generate", json={"x": 3, "top_p": 1})
    assert bad.status_code == 422 and "top_p" in error_of(bad)["error"]


@pytest.mark.parametrize(
    "content_type",
    [None, "application/x-www-form-urlencoded", "text/plain", "application/json; charset=utf-8"],
)
def test_oip_generate_reads_json_whatever_the_content_type_says(
    server: LiveServer, content_type: str | None
) -> None:
    """As OIP's infer and Triton's own generate do: ``curl -d`` (a form's type) and
    clients that send none are read as JSON; a msgpack body is refused (415)."""
    headers = {} if content_type is None else {"content-type": content_type}
    body = orjson.dumps({"x": 3, "max_new_tokens": 2})
    for kind in ("generate", "generate_stream"):
        r = httpx.post(f"{server.url}/v2/models/count/{kind}", content=body, headers=headers)
        assert r.status_code == 200, (kind, r.text)
        assert "4" in r.text
    packed = httpx.post(
        f"{server.url}/v2/models/count/generate",
        content=body,
        headers={"content-type": "application/msgpack"},
    )
    assert packed.status_code == 415 and "JSON" in error_of(packed)["error"]


def test_metrics_and_describe_report_generation(server: LiveServer) -> None:
    httpx.post(url(server), json={"x": [0], "parameters": {"max_new_tokens": 4}})
    metrics = httpx.get(f"{server.url}/metrics").text
    for series in (
        'fnrt_time_to_first_token_seconds_count{function="count"} 1.0',
        'fnrt_time_per_output_token_seconds_count{function="count"} 1.0',
        'fnrt_generated_tokens_total{function="count"} 4.0',
        'fnrt_sequences_total{function="count",reason="length"} 1.0',
        "fnrt_step_size_bucket",
    ):
        assert series in metrics, series
    generation = httpx.get(f"{server.url}/v1/functions/count").json()["instance"]["generation"]
    assert generation["sequences"] == 1 and generation["tokens"] == 4
    assert generation["time_to_first_token"]["count"] == 1


def test_process_isolation_streams_the_same(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv:
        deploy(srv, tmp_path, "inproc", mode="thread")
        deploy(srv, tmp_path, "worker", mode="process")
        body = {"x": [3], "parameters": {"max_new_tokens": 6}}
        a = httpx.post(url(srv, "inproc"), json=body, timeout=60).json()
        b = httpx.post(url(srv, "worker"), json=body, timeout=60).json()
        assert a["outputs"] == b["outputs"] == {"n": [4, 5, 6, 7, 8, 9], "text": ["4 5 6 7 8 9 "]}
        described = httpx.get(f"{srv.url}/v1/functions/worker").json()["instance"]
        assert described["isolation"] == "process"


def test_a_new_version_takes_new_requests_while_running_sequences_finish_on_the_old(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with live_server(tmp_path) as srv:
        deploy(srv, tmp_path, "swap")
        long = {"x": [0], "parameters": {"max_new_tokens": 40, "delay_ms": 15, "stream": True}}
        with httpx.stream("POST", url(srv, "swap"), json=long) as r:
            old = r.headers["x-fnrt-version"]
            lines = r.iter_lines()
            next(e for e in sse_events(lines) if e[0] == "chunk")
            folder = tmp_path / "src" / "swap"
            text = (folder / "fnrt.toml").read_text()
            (folder / "fnrt.toml").write_text('description = "v2"\n' + text)
            assert main(["deploy", str(folder), "--server", srv.url, "-q"]) == 0
            new = httpx.post(url(srv, "swap"), json={"x": [0], "parameters": {"max_new_tokens": 1}})
            assert new.headers["x-fnrt-version"] != old
            events = list(sse_events(lines))
        assert events[-1][0] == "done" and events[-1][1]["finish_reason"] == "length"
        assert [d["n"] for k, d in events if k == "chunk"][-1] == [40]  # none lost
    capsys.readouterr()


def test_a_function_is_not_scaled_to_zero_while_a_sequence_runs(tmp_path: Path) -> None:
    manifest = COUNTER_MANIFEST.replace("[scaling]", "[scaling]\nkeep_alive_s = 0.1")
    manifest = manifest.replace("[scaling]", '[scaling]\nkeep_alive_policy = "fixed"')
    with live_server(tmp_path, sweep_interval_s=0.05) as srv:
        folder = write_function(tmp_path / "src", "idle", COUNTER_HANDLER, manifest,
                                max_active=4, max_queue=8, mode="thread")  # fmt: skip
        assert main(["deploy", str(folder), "--server", srv.url, "-q"]) == 0
        body = {"x": [0], "parameters": {"max_new_tokens": 30, "delay_ms": 20}}
        r = httpx.post(url(srv, "idle"), json=body)  # 0.6 s: six keep-alives long
        assert r.status_code == 200 and r.json()["outputs"]["n"][-1] == 30

        def state() -> str:
            return str(httpx.get(f"{srv.url}/v1/functions/idle").json()["instance"]["state"])

        wait_until(lambda: state() == "cold")  # and once idle, it goes


def test_a_traced_generate_records_queue_and_generate_under_its_server_span(
    tmp_path: Path,
) -> None:
    from fnrt.runtime.http.generate import ROUTE
    from support import traced_server

    with traced_server(tmp_path) as (srv, exporter):
        folder = write_function(tmp_path / "src", "count", COUNTER_HANDLER, COUNTER_MANIFEST,
                                max_active=4, max_queue=8, mode="thread")  # fmt: skip
        srv.deploy(folder)
        r = httpx.post(url(srv), json={"x": [0], "parameters": {"max_new_tokens": 3}})
        assert r.status_code == 200

        def named(name: str) -> list[Any]:
            return [s for s in list(exporter.spans) if s.name == name]

        wait_until(lambda: len(named("generate")) == 1 and len(named(f"POST {ROUTE}")) == 1)
        (root,) = named(f"POST {ROUTE}")
        (generate,) = named("generate")
        (queue,) = named("queue")
        assert generate.parent == root.context and queue.parent == root.context
        assert generate.attributes["fnrt.tokens.completion"] == 3
        assert generate.attributes["fnrt.finish_reason"] == "length"
        assert root.attributes["http.response.status_code"] == 200


def test_cli_invoke_streams_text_as_it_comes(
    server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["invoke", "count", "--json", '{"x": [3]}', "--server", server.url]
    assert main([*args, "--stream", "--param", "max_new_tokens=3"]) == 0
    out, err = capsys.readouterr()
    assert out == "4 5 6 \n" and "[length: 3 tokens" in err
    assert main([*args, "--stream", "--param", "top_k=3"]) != 0
    assert "top_k" in capsys.readouterr().err
    assert main([*args, "--stream", "--param", "oops"]) != 0


def test_the_token_budget_holds_back_what_does_not_fit(tmp_path: Path) -> None:
    manifest = COUNTER_MANIFEST.replace(
        "max_prompt_tokens = 1", "max_prompt_tokens = 1\ntoken_budget = 60"
    )
    with live_server(tmp_path) as srv:
        folder = write_function(tmp_path / "src", "budget", COUNTER_HANDLER, manifest,
                                max_active=8, max_queue=8, mode="thread")  # fmt: skip
        assert main(["deploy", str(folder), "--server", srv.url, "-q"]) == 0
        gates.loads.clear()
        small = {"x": [0], "parameters": {"max_new_tokens": 20, "delay_ms": 5}}  # 21 tokens
        big = {"x": [0], "parameters": {"max_new_tokens": 50, "delay_ms": 5}}  # 51 tokens
        answers: list[httpx.Response] = []
        threads = [
            threading.Thread(
                target=lambda b=b: answers.append(httpx.post(url(srv, "budget"), json=b))
            )
            for b in (small, small, big)
        ]
        for t in threads:
            t.start()
            time.sleep(0.02)
        for t in threads:
            t.join()
        assert sorted(len(a.json()["outputs"]["n"]) for a in answers) == [20, 20, 50]
        sizes = [len(step) for step in gates.loads]
        assert max(sizes) == 2  # the two small ones (42 tokens) together, the big one alone
        ids_with_big = [step for step in gates.loads if any(g >= 20 for _, g in step)]
        assert all(len(step) == 1 for step in ids_with_big)


ASYNC_COUNTER = """
import asyncio
from fnrt.functions import Chunk

class Counter:
    async def start(self, sequences):
        await asyncio.sleep(0)
        for s in sequences:
            s.state = int(s.inputs["x"][0])
        return [self._emit(s) for s in sequences]

    async def step(self, sequences):
        await asyncio.sleep(0)
        return [self._emit(s) for s in sequences]

    def _emit(self, s):
        s.state += 1
        return {"n": [s.state], "text": [str(s.state).encode()]}
"""


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_an_async_generative_handler(tmp_path: Path, mode: str) -> None:
    with live_server(tmp_path) as srv:
        folder = write_function(tmp_path / "src", "acount", ASYNC_COUNTER, COUNTER_MANIFEST,
                                max_active=4, max_queue=8, mode=mode)  # fmt: skip
        assert main(["deploy", str(folder), "--server", srv.url, "-q"]) == 0
        r = httpx.post(url(srv, "acount"), json={"x": [1], "parameters": {"max_new_tokens": 3}},
                       timeout=60)  # fmt: skip
        assert r.json()["outputs"] == {"n": [2, 3, 4], "text": ["234"]}


def test_a_drain_waits_for_running_sequences_between_their_steps(server: LiveServer) -> None:
    answers: list[httpx.Response] = []
    body = {"x": [0], "parameters": {"max_new_tokens": 25, "delay_ms": 20}}
    thread = threading.Thread(target=lambda: answers.append(httpx.post(url(server), json=body)))
    thread.start()
    wait_until(lambda: server.node.schedulers()[0].sequencer.active == 1)
    assert server.call(server.node.drain(10.0)) is True
    # it returned once the sequence ended
    assert sched.outstanding(server.node.schedulers()[0]) == 0
    thread.join()
    assert answers[0].json()["outputs"]["n"][-1] == 25


def test_fnrt_describe_summarises_generation(
    server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    httpx.post(url(server), json={"x": [0], "parameters": {"max_new_tokens": 3}})
    assert main(["describe", "count", "--server", server.url]) == 0
    out = capsys.readouterr().out
    assert "generation" in out and "0 active of 8; length 1; 3 tokens; first token p50" in out


def test_an_oip_infer_of_a_generative_function_answers_its_whole_result(
    server: LiveServer,
) -> None:
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [96]}]}
    r = httpx.post(f"{server.url}/v2/models/count/infer", json=body)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o for o in r.json()["outputs"]}
    assert outputs["n"]["data"] == list(range(97, 147)) and outputs["n"]["shape"] == [50]
    assert r.headers["x-fnrt-finish-reason"] == "length"


def test_a_high_priority_request_joins_before_earlier_normal_ones(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv:
        deploy(srv, tmp_path, "one", max_active=1)
        ended: list[str] = []

        def ask(label: str, priority: str, tokens: int) -> None:
            body = {"x": [0], "parameters": {"max_new_tokens": tokens, "delay_ms": 10}}
            httpx.post(url(srv, "one"), json=body, headers={"x-fnrt-priority": priority})
            ended.append(label)

        first = threading.Thread(target=ask, args=("running", "normal", 20))
        first.start()
        wait_until(lambda: srv.node.schedulers()[0].sequencer.active == 1)
        later = [threading.Thread(target=ask, args=(f"normal{i}", "normal", 3)) for i in range(2)]
        for t in later:
            t.start()
        wait_until(lambda: srv.node.schedulers()[0].batcher.queued == 2)
        high = threading.Thread(target=ask, args=("high", "high", 3))
        high.start()
        for t in (first, *later, high):
            t.join()
        assert ended[:2] == ["running", "high"], ended
