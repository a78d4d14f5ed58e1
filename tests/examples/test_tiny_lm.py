"""The ``tiny-lm`` example, trained by its own script, served with continuous batching:
streamed text equals the whole answer and the model run by itself, alone or batched."""

from __future__ import annotations

import importlib.util
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from safetensors.torch import load_file

from fnrt.client import Client
from fnrt.runtime.cli.main import main
from support import LiveServer, live_server

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-lm"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example with weights from a short training run (the quality is not tested)."""
    out = tmp_path_factory.mktemp("tiny-lm") / "tiny-lm"
    shutil.copytree(EXAMPLE, out, ignore=shutil.ignore_patterns("weights.safetensors"))
    train_script().train(out / "weights.safetensors", steps=60)
    return out


def train_script() -> Any:
    spec = importlib.util.spec_from_file_location("fnrt_tiny_lm_train", EXAMPLE / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference(folder: Path, prompt: str, n: int, temperature: float, seed: int) -> str:
    m = train_script().load_model_module()
    net = m.TinyLM()
    net.load_state_dict(load_file(folder / "weights.safetensors"))
    return str(m.generate(net.eval(), prompt, n, temperature, seed))


@pytest.fixture
def server(
    tmp_path: Path, folder: Path, capsys: pytest.CaptureFixture[str]
) -> Iterator[LiveServer]:
    with live_server(tmp_path) as srv:
        assert main(["deploy", str(folder), "--server", srv.url, "-q"]) == 0
        capsys.readouterr()
        yield srv


CASES = [("The keeper", 0.0, 0), ("The boy asked", 0.9, 7), ("Years passed", 1.2, 3)]


def test_streamed_whole_and_by_itself_agree(server: LiveServer, folder: Path) -> None:
    with Client(server.url, timeout_s=60) as client:
        for prompt, temperature, seed in CASES:
            params = {"max_new_tokens": 40, "temperature": temperature, "seed": seed}
            events = list(client.generate("tiny-lm", {"prompt": [prompt]}, params))
            streamed = "".join(e.data["text"][0].decode() for e in events if e.kind == "chunk")
            assert events[-1].kind == "done" and events[-1].data["finish_reason"] == "length"
            whole = httpx.post(
                f"{server.url}/v1/functions/tiny-lm/generate",
                json={"prompt": [prompt], "parameters": params},
                timeout=60,
            ).json()["outputs"]["text"][0]
            alone = reference(folder, prompt, 40, temperature, seed)
            assert streamed == whole == alone, (prompt, streamed, whole, alone)


def test_concurrent_sequences_share_steps_and_keep_their_text(
    server: LiveServer, folder: Path
) -> None:
    answers: dict[int, Any] = {}

    def ask(i: int) -> None:
        prompt, temperature, seed = CASES[i % len(CASES)]
        body = {
            "prompt": [prompt],
            "parameters": {"max_new_tokens": 20 + 7 * i, "temperature": temperature, "seed": seed},
        }
        url = f"{server.url}/v1/functions/tiny-lm/generate"
        answers[i] = httpx.post(url, json=body, timeout=60).json()

    httpx.post(f"{server.url}/v1/functions/tiny-lm/warm", timeout=60)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, answer in answers.items():
        prompt, temperature, seed = CASES[i % len(CASES)]
        assert answer["outputs"]["text"][0] == reference(
            folder, prompt, 20 + 7 * i, temperature, seed
        )
    described = httpx.get(f"{server.url}/v1/functions/tiny-lm").json()["instance"]["generation"]
    assert described["step_size"]["p99"] > 1  # some steps ran several sequences at once


def test_a_stop_string_ends_the_sequence(server: LiveServer, folder: Path) -> None:
    body = {"prompt": ["The keeper"], "parameters": {"max_new_tokens": 100, "stop": "the"}}
    r = httpx.post(f"{server.url}/v1/functions/tiny-lm/generate", json=body, timeout=60).json()
    text = r["outputs"]["text"][0]
    alone = reference(folder, "The keeper", 100, 0.0, 0)
    assert "the" in alone  # the model alone says it within 100 characters
    assert r["finish_reason"] == "stop"
    assert text == alone[: alone.index("the") + 3]  # the handler stopped right after it
