"""A job on an S3 store (moto's server): its queue, leases and results through S3's
conditional writes, and its input read by the store's own URI."""

from __future__ import annotations

import json
import time
from pathlib import Path

from s3support import MotoEndpoint

from fnrt.runtime.clock import SystemClock
from support import live_server, s3_registry, write_function


def test_a_job_reads_its_records_from_s3_and_writes_its_results_there(
    tmp_path: Path, s3: MotoEndpoint
) -> None:
    node = s3_registry(tmp_path / "node", s3.url, SystemClock())
    with live_server(tmp_path / "node", node=node) as srv:
        folder = write_function(tmp_path / "src", "echo", max_batch_size=16)
        srv.deploy(folder)
        store = srv.node.repository.store
        lines = [json.dumps({"x": [[i, 1, 2, 3]]}) for i in range(500)]
        store.put("inputs/day.jsonl", ("\n".join(lines) + "\n").encode())
        with srv.client() as c:
            r = c.post(
                "/v1/functions/echo/jobs",
                json={"input": f"{store.uri}/inputs/day.jsonl", "chunk_records": 100},
            )
            assert r.status_code == 202, r.text
            deadline = time.monotonic() + 60
            while (status := c.get(r.headers["location"]).json())["state"] == "queued" or (
                status["state"] == "running"
            ):
                assert time.monotonic() < deadline, status
                time.sleep(0.1)
            results = c.get(r.headers["location"] + "/result").text.splitlines()
            listed = c.get("/v1/jobs").json()["jobs"]
    assert status["state"] == "done" and status["progress"]["chunks_done"] == 5
    assert status["source"] == "inputs/day.jsonl"
    assert json.loads(results[499]) == {"index": 499, "outputs": {"y": [[998.0, 2.0, 4.0, 6.0]]}}
    assert [j["id"] for j in listed] == [status["id"]]
    assert store.list("jobqueue/") == []  # ended: off the queue
    assert len(store.list(f"jobs/{status['id']}/done/")) == 5
