"""docs/generation.md, run as written: its handler, manifest, requests and client."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from fnrt.client import Client
from fnrt.runtime.cli.main import main
from support import live_server

DOC = Path(__file__).resolve().parents[2] / "docs" / "generation.md"


def block(first_line: str) -> str:
    for body in re.findall(r"```\w*\n(.*?)```", DOC.read_text(), flags=re.S):
        if body.startswith(first_line + "\n"):
            return str(body)
    raise AssertionError(f"generation.md has no block starting {first_line!r}")


def test_the_shout_example_answers_as_documented(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "shout"
    folder.mkdir()
    (folder / "handler.py").write_text(block("# shout/handler.py"))
    (folder / "fnrt.toml").write_text(block("# shout/fnrt.toml"))
    with live_server(tmp_path) as srv:
        assert main(["deploy", str(folder), "--server", srv.url, "-q"]) == 0
        url = f"{srv.url}/v1/functions/shout/generate"
        whole = httpx.post(url, json={"prompt": ["hello"], "parameters": {"bangs": 2}}).json()
        assert whole["outputs"] == {"text": ["HELLO!!"]} and whole["finish_reason"] == "stop"
        streamed = httpx.post(
            url, json={"prompt": ["hi"]}, headers={"accept": "text/event-stream"}
        ).text
        assert streamed.count("event: chunk") == 3 and '"completion_tokens":3' in streamed
        assert 'data: {"text":["H"]}' in streamed
        client_code = block("from fnrt.client import Client")
        with Client(srv.url) as client:
            events = list(client.generate("shout", {"prompt": ["hey"]}, {"bangs": 3}))
        assert "".join(e.data["text"][0].decode() for e in events[:-1]) == "HEY!!!"
        assert '"shout", {"prompt": ["hey"]}, {"bangs": 3}' in client_code
        too_long = httpx.post(url, json={"prompt": ["x" * 101]})
        assert too_long.status_code == 422
