"""A function whose worker crashes on every call opens its breaker, whatever the traffic.

The handler calls ``ctypes.string_at(0)`` (a real segfault in a real worker
process) on every batch. Three worker deaths in a row open the breaker: every
queued request and every new one is answered 503 with ``Retry-After`` within a
second of the third death, not after the restart backoff; a neighbour never
notices; and the breaker probes half-open, as for any other failure, once its
``open_s`` and the restart backoff have passed.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from support import MISBEHAVING_HANDLER as HANDLER
from support import LiveServer, error_of, live_server, write_function

MANIFEST = """
name = "{name}"
handler = "handler:H"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 4] }}

[isolation]
mode = "process"

[breaker]
open_s = 3.0
half_open_probes = 1
"""
CRASH = {"x": [[1, 0, 0, 0]]}  # the handler reads address 0
FINE = {"x": [[10, 1, 2, 3]]}


def _deploy(srv: LiveServer, tmp_path: Path, name: str) -> None:
    folder = write_function(tmp_path / "src", name, HANDLER, MANIFEST)
    srv.deploy(folder)


class Steady:
    """A neighbour called from a thread until stopped; every status is recorded."""

    def __init__(self, srv: LiveServer, name: str) -> None:
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(srv, name), daemon=True)
        self._thread.start()

    def _run(self, srv: LiveServer, name: str) -> None:
        with srv.client() as c:
            while not self._stop.is_set():
                self.statuses.append(c.post(f"/v1/functions/{name}/invoke", json=FINE).status_code)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(30)
        return self.statuses


def test_a_crash_loop_opens_the_breaker_for_queued_and_new_requests(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        _deploy(srv, tmp_path, "crashy")
        _deploy(srv, tmp_path, "calm")
        assert c.post("/v1/functions/calm/invoke", json=FINE).status_code == 200
        neighbour = Steady(srv, "calm")
        answers: list[tuple[float, float, httpx.Response]] = []  # sent, answered, answer

        def call(_: int) -> None:
            with httpx.Client(base_url=srv.url, timeout=30) as own:
                sent = time.monotonic()
                r = own.post("/v1/functions/crashy/invoke", json=CRASH)
                answers.append((sent, time.monotonic(), r))

        try:
            with ThreadPoolExecutor(40) as pool:  # 40 at once: 8 per batch, 5 batches' worth
                list(pool.map(call, range(40)))
        finally:
            statuses = neighbour.stop()
        assert len(answers) == 40
        died = [(answered, r) for _, answered, r in answers if r.status_code == 500]
        refused = [(sent, answered, r) for sent, answered, r in answers if r.status_code == 503]
        assert len(died) + len(refused) == 40, [r.status_code for _, _, r in answers]
        for _, r in died:
            assert error_of(r)["cause"] == "signal", error_of(r)
        restarts = c.get("/v1/functions/crashy").json()["instance"]["restarts"]
        assert restarts == {"signal": 3}, restarts  # no fourth worker was given a batch
        third_death = max(answered for answered, _ in died)  # its batch answered as it died
        assert refused, "no request was refused once the breaker opened"
        for sent, answered, r in refused:
            assert "circuit breaker is open" in error_of(r)["error"]
            assert "SIGSEGV" in error_of(r)["error"]  # the last failure, named
            assert int(r.headers["retry-after"]) >= 1
            # queued: within 1 s of the third death; sent after it: at once
            assert answered - max(sent, third_death) < 1.0, (answered - third_death, sent)
        # a new request is refused at once, while the function backs off
        asked = time.monotonic()
        r = c.post("/v1/functions/crashy/invoke", json=CRASH)
        assert r.status_code == 503 and "retry-after" in r.headers
        assert time.monotonic() - asked < 0.5
        breaker = c.get("/v1/functions/crashy").json()["instance"]["breaker"]
        assert breaker["state"] == "open" and breaker["deaths_in_a_row"] == 3, breaker
        assert statuses and set(statuses) == {200}, statuses  # the neighbour never noticed
        # half-open after open_s and the backoff: a probe that crashes opens it again...
        probe = _until_admitted(c, CRASH, 10)
        assert probe.status_code == 500 and error_of(probe)["cause"] == "signal"
        assert c.post("/v1/functions/crashy/invoke", json=FINE).status_code == 503
        # ...and a probe that succeeds closes it
        fine = _until_admitted(c, FINE, 30)
        assert fine.status_code == 200, error_of(fine)
        assert c.get("/v1/functions/crashy").json()["instance"]["breaker"]["state"] == "closed"
        assert c.post("/v1/functions/crashy/invoke", json=FINE).status_code == 200


def _until_admitted(c: httpx.Client, body: dict, timeout_s: float) -> httpx.Response:
    """The first answer that is not the open breaker's 503 (polled at its Retry-After)."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = c.post("/v1/functions/crashy/invoke", json=body)
        if r.status_code != 503 or time.monotonic() > deadline:
            return r
        time.sleep(min(float(r.headers.get("retry-after", 1)), 1.0) / 4)
