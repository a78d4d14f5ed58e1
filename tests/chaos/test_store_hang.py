"""A store that accepts connections and never answers: a cold invoke gets 503 within the
store's deadline, naming the store, and ``/readyz`` says why (#41)."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from s3support import CREDENTIALS, MotoProcess, moto_process

from fnrt.loader.cache import BlobCache, CacheConfig
from fnrt.loader.device import detect_device
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.repository import Repository
from fnrt.runtime.clock import ManualClock
from support import (
    WEIGHTED_HANDLER,
    WEIGHTED_MANIFEST,
    LiveServer,
    error_of,
    live_server,
    make_node,
    write_function,
)

X = {"x": [[1.0, 2.0, 3.0, 4.0]]}
WEIGHTS = bytes([7]) * (1 << 20)
#: connect 0.5 s, read 1 s, 3 s an operation with its retries: a hang shows in seconds
BOUNDS = {"connect_timeout_s": 0.5, "read_timeout_s": 1.0, "deadline_s": 3.0}
SLACK_S = 1.5  # what a loaded test machine may add


@pytest.fixture
def moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoProcess]:
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    with moto_process() as server:
        server.make_bucket("fnrt")
        yield server


def _probe(srv: LiveServer) -> int:
    with srv.client() as c:
        return c.get("/readyz").status_code


def test_a_cold_invoke_on_a_frozen_store_is_503_within_the_deadline(
    tmp_path: Path, moto: MotoProcess
) -> None:
    from fnrt.runtime.cli.main import main

    folder = write_function(
        tmp_path / "src", "weighted", WEIGHTED_HANDLER, WEIGHTED_MANIFEST, files={"w.bin": WEIGHTS}
    )
    argv = ["deploy", str(folder), "--store", "s3://fnrt/fns", "--s3-endpoint", moto.url, "-q"]
    assert main(argv) == 0
    repository = Repository(moto.store("fnrt", "fns", **BOUNDS))
    cache = BlobCache(CacheConfig(tmp_path / "cache"))
    loader = InstanceLoader(repository, tmp_path / "cache", detect_device("cpu"), cache)
    node = make_node(
        tmp_path, ManualClock(), loader=loader, isolation="thread", watch_interval_s=3600
    )
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        assert c.post("/v1/functions/weighted/invoke", json=X).json() == {"y": [[8, 9, 10, 11]]}
        assert c.post("/v1/functions/weighted/unload").json()["unloaded"]
        digest = hashlib.sha256(WEIGHTS).hexdigest()
        for path in (tmp_path / "cache" / "blobs").glob(f"{digest}*"):
            os.unlink(path)  # the L2 copy gone: the next load fetches from the store
        moto.freeze()
        try:
            started = time.monotonic()
            r = c.post("/v1/functions/weighted/invoke", json=X)
            took = time.monotonic() - started
            # was: no answer for as long as the store stayed frozen (98.8 s in the issue)
            assert r.status_code == 503, r.text
            assert took < BOUNDS["deadline_s"] + SLACK_S, took
            error = error_of(r)
            assert error["store"] == "s3://fnrt/fns", error
            assert "s3://fnrt/fns/blobs/sha256/" + digest in error["error"]
            assert "ReadTimeout" in error["error"]
            ready = c.get("/readyz")
            assert ready.status_code == 503
            reason = ready.json()["error"]
            # was: "store: " (a timeout's empty message)
            assert reason.startswith("store s3://fnrt/fns: ") and len(reason) > 40, reason
            # probes that come while the store hangs wait for the one check under way
            sent = repository.store.requests["GetObject"]
            with ThreadPoolExecutor(5) as pool:
                probes = list(pool.map(lambda _: _probe(srv), range(5)))
            assert probes == [503] * 5
            assert repository.store.requests["GetObject"] - sent <= 2  # one check, one retry
        finally:
            moto.thaw()
        r = c.post("/v1/functions/weighted/invoke", json=X)  # the store is back: so is it
        assert r.json() == {"y": [[8, 9, 10, 11]]}
        assert c.get("/readyz").status_code == 200
