"""``fnrt job`` against a live server: submit a file, follow it, fetch, list, cancel."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fnrt.runtime.cli.job import is_store_ref
from fnrt.runtime.cli.main import main
from support import live_server, write_function


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_submit_wait_get_ls_and_cancel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = tmp_path / "in.jsonl"
    records.write_text("".join(json.dumps({"x": [[i, 0, 0, 1]]}) + "\n" for i in range(300)))
    with live_server(tmp_path, isolation="thread", job_poll_interval_s=0.05) as srv:
        folder = write_function(tmp_path / "src", "echo", max_batch_size=32)
        srv.deploy(folder)
        s = ("--server", srv.url)
        code, out, err = run(
            capsys, "job", "submit", "echo", "-i", str(records), "--chunk-records", "100",
            "--wait", *s,
        )  # fmt: skip
        assert code == 0, err
        assert "upload" in err and "rec" in err  # the two progress bars
        first_line = out.splitlines()[0]
        assert first_line.startswith("job ") and first_line.endswith(": done")
        job_id = first_line.split()[1].rstrip(":")
        assert "300 of 300 done, 0 failed (3 of 3 chunks)" in out

        code, out, _ = run(capsys, "job", "status", job_id, "--json", *s)
        assert json.loads(out)["progress"]["records_done"] == 300

        code, out, _ = run(capsys, "job", "get", job_id, "-o", str(tmp_path / "out.npz"), *s)
        assert code == 0 and "300 records, 0 failed" in out
        y = np.load(tmp_path / "out.npz")["y"]
        assert y.shape == (300, 1, 4) and y[299].tolist() == [[598, 0, 0, 2]]
        run(capsys, "job", "get", job_id, "-o", str(tmp_path / "out.jsonl"), *s)
        assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 300

        store_key = "inputs/again.jsonl"
        srv.node.repository.store.put(store_key, records.read_bytes())
        code, out, _ = run(capsys, "job", "submit", "echo", "-i", f"store:{store_key}", *s)
        assert code == 0
        second = out.split()[1].rstrip(":")

        code, out, _ = run(capsys, "job", "ls", *s)
        rows = [line.split() for line in out.splitlines()]
        assert rows[0] == ["ID", "FUNCTION", "STATE", "DONE", "FAILED", "CREATED"]
        assert [r[0] for r in rows[1:]] == [job_id, second]

        srv.call(srv.node.jobs.close())  # the node stops taking chunks: the job stays queued
        code, out, _ = run(capsys, "job", "submit", "echo", "-i", str(records), *s)
        third = out.split()[1].rstrip(":")
        code, out, _ = run(capsys, "job", "cancel", third, *s)
        assert code == 0 and out.startswith(f"job {third}: cancelled")
        code, _, err = run(capsys, "job", "cancel", third, *s)
        assert code == 1 and "error 409" in err and "already cancelled" in err

        code, _, err = run(capsys, "job", "submit", "echo", "-i", str(tmp_path / "no.jsonl"), *s)
        assert code == 1 and "no such file" in err
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"x": [[1, 2, 3, 4]]}\n{"x": [[1, 2]]}\n')
        code, _, err = run(capsys, "job", "submit", "echo", "-i", str(bad), *s)
        assert code == 1 and "error 422" in err and "record 1 (line 2)" in err


def test_store_references() -> None:
    assert is_store_ref("s3://bucket/in.jsonl") and is_store_ref("store:in.jsonl")
    assert not is_store_ref("data/in.jsonl")


@pytest.mark.parametrize("command", ["submit", "status", "get", "cancel", "ls"])
def test_every_job_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["job", command, "--help"]) == 0
    assert f"Usage: fnrt job {command}" in capsys.readouterr().out


FAILING_HANDLER = """
class Echo:
    def load(self, artifacts, device):
        pass

    def __call__(self, batch):
        raise ValueError("never")
"""


def test_a_failed_jobs_status_exits_1_as_its_submit_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = tmp_path / "in.jsonl"
    records.write_text("".join(json.dumps({"x": [[i, 0, 0, 1]]}) + "\n" for i in range(3)))
    with live_server(tmp_path, isolation="thread", job_poll_interval_s=0.05) as srv:
        srv.deploy(write_function(tmp_path / "src", "echo", FAILING_HANDLER))
        s = ("--server", srv.url)
        code, out, err = run(capsys, "job", "submit", "echo", "-i", str(records), "--wait", *s)
        assert code == 1 and ": failed" in out.splitlines()[0], (out, err)
        job_id = out.split()[1].rstrip(":")
        code, out, _ = run(capsys, "job", "status", job_id, *s)
        assert code == 1 and "failed" in out.splitlines()[0]
