"""``async def`` handlers run on an event loop of their instance's own; generators are
refused at deploy (they used to pass deploy and then fail every call with a 500)."""

from __future__ import annotations

import gc
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from fnrt.loader.device import detect_device
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.repository import Repository
from fnrt.loader.stores import FileStore
from fnrt.runtime.cli.main import main
from support import live_server, open_fds, publish, write_function

ASYNC_CLASS = """
import asyncio, os, threading

class Model:
    async def load(self, artifacts, device):
        await asyncio.sleep(0)
        self.scale = 2.0

    async def __call__(self, batch):
        await asyncio.sleep(0.001)  # awaits work, on its own loop
        where = [float(id(asyncio.get_running_loop()) % 1000003), float(os.getpid())]
        return [{"y": r["x"] * self.scale, "where": where} for r in batch]

    async def unload(self):
        await asyncio.sleep(0)
"""

ASYNC_FUNCTION = """
import asyncio

async def handle(batch):
    await asyncio.sleep(0)
    return [{"y": r["x"] + 1} for r in batch]
"""

GENERATOR = """
def handle(batch):
    for r in batch:
        yield {"y": r["x"]}
"""

ASYNC_GENERATOR = """
class Model:
    async def __call__(self, batch):
        for r in batch:
            yield {"y": r["x"]}
"""

MANIFEST = """
name = "{name}"
handler = "handler:{attribute}"

[isolation]
mode = "{mode}"
"""

X = {"x": [[1.0, 2.0, 3.0, 4.0]]}


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_async_handlers_answer_from_their_own_loop(tmp_path: Path, mode: str) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        for name, source, attribute in (
            ("cls", ASYNC_CLASS, "Model"),
            ("fn", ASYNC_FUNCTION, "handle"),
        ):
            folder = write_function(tmp_path / "src", name, source, MANIFEST,
                                    attribute=attribute, mode=mode)  # fmt: skip
            assert main(["deploy", str(folder), "--server", srv.url, "-q"]) == 0
        r = c.post("/v1/functions/cls/invoke", json=X)
        assert r.status_code == 200, r.text
        assert r.json()["y"] == [[2, 4, 6, 8]]
        server_loop = float(id(srv.loop) % 1000003)
        assert r.json()["where"][0] != server_loop  # never the server's event loop
        assert c.post("/v1/functions/fn/invoke", json=X).json() == {"y": [[2, 3, 4, 5]]}
        assert c.post("/v1/functions/cls/unload").json()["unloaded"] is True  # async unload


@pytest.mark.parametrize(
    ("source", "attribute"), [(GENERATOR, "handle"), (ASYNC_GENERATOR, "Model")]
)
def test_a_generator_handler_is_refused_at_deploy(
    tmp_path: Path, source: str, attribute: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_function(tmp_path / "src", "gen", source, MANIFEST,
                            attribute=attribute, mode="thread")  # fmt: skip
    with live_server(tmp_path) as srv:
        assert main(["deploy", str(folder), "--server", srv.url, "-q"]) != 0
        err = capsys.readouterr().err
        assert "is a Python generator" in err and "docs/generation.md" in err
        assert httpx.get(f"{srv.url}/v1/functions/gen").status_code == 404  # nothing deployed


FAILING_ASYNC_LOAD = """
class Model:
    async def load(self, artifacts, device):
        raise RuntimeError("no weights")

    async def __call__(self, batch):
        return [{"y": r["x"]} for r in batch]
"""


def test_an_async_load_that_fails_closes_its_instances_loop(tmp_path: Path) -> None:
    """Before, the loop made for the handler's async hooks stayed open when its load
    raised (three descriptors a try: its epoll and self-pipe, until a collection), and a
    crash-looping load retried every backoff."""
    folder = write_function(tmp_path / "src", "bad", FAILING_ASYNC_LOAD, MANIFEST,
                            attribute="Model", mode="thread")  # fmt: skip
    repository = Repository(FileStore(tmp_path / "store"))
    vm = publish(repository, folder)
    loader = InstanceLoader(repository, tmp_path / "cache", detect_device("cpu"))
    with ThreadPoolExecutor(1) as executor:
        executor.submit(lambda: None).result()  # its thread started
        gc.disable()  # what the collector would free, left to it
        try:
            before = len(open_fds())
            for _ in range(4):
                with pytest.raises(RuntimeError, match="no weights"):
                    executor.submit(loader.load, vm, executor).result()
            assert len(open_fds()) <= before + 2  # less than one loop's
        finally:
            gc.enable()


ASYNC_STAGED = """
import asyncio, os

class Model:
    async def load(self, artifacts, device):
        await asyncio.sleep(0)
        self.scale = 2.0

    def forward(self, inputs):
        return {"y": inputs["x"] * self.scale}

    async def unload(self):
        await asyncio.sleep(0)
        count = os.environ.get("FNRT_TEST_STAGED_UNLOADED", "0")
        os.environ["FNRT_TEST_STAGED_UNLOADED"] = str(int(count) + 1)
"""

STAGED_MANIFEST = """
name = "{name}"
handler = "handler:Model"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 4] }}

[isolation]
mode = "thread"
"""


def test_a_staged_handlers_async_hooks_loop_closes_with_its_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``forward`` handler with an async ``load``/``unload``: closing its instance
    awaits its ``unload`` and closes the loop made for them (before, each load left
    one open: its epoll and self-pipe, until a collection, and ``unload`` never ran)."""
    monkeypatch.setenv("FNRT_TEST_STAGED_UNLOADED", "0")
    folder = write_function(tmp_path / "src", "staged", ASYNC_STAGED, STAGED_MANIFEST)
    repository = Repository(FileStore(tmp_path / "store"))
    vm = publish(repository, folder)
    loader = InstanceLoader(repository, tmp_path / "cache", detect_device("cpu"))

    def load_run_close() -> None:
        with ThreadPoolExecutor(1) as executor:  # the instance's thread, ended with it
            instance = executor.submit(loader.load, vm, executor).result()
            assert instance.stages
            ran = executor.submit(instance.run_timed, [{"x": np.ones((2, 4), np.float32)}])
            np.testing.assert_array_equal(ran.result().results[0]["y"], np.full((2, 4), 2.0))
            instance.close()

    load_run_close()  # the first load's one-time costs (torch's imports) are behind
    gc.disable()  # what the collector would free, left to it
    try:
        before = len(open_fds())
        for _ in range(4):
            load_run_close()
        assert len(open_fds()) <= before + 2  # less than one loop's
    finally:
        gc.enable()
    assert os.environ["FNRT_TEST_STAGED_UNLOADED"] == "5"  # every async unload ran
