"""``fnrt dev``: a separate process that redeploys a folder on every edit."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from support import free_port, write_function


def test_dev_picks_up_an_edit_and_survives_a_broken_one(tmp_path: Path) -> None:
    folder = write_function(tmp_path, "echo")
    port = free_port()
    argv = [sys.executable, "-m", "fnrt.runtime.cli.main", "dev", str(folder)]
    env = os.environ | {"FNRT_PORT": str(port)}  # as fnrt serve reads it (was ignored)
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()

    def next_event(timeout_s: float = 30) -> str:
        """The next line fnrt dev prints about a (re)deploy."""
        deadline = time.monotonic() + timeout_s
        while True:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            if "serving v-" in line or "not deployed" in line:
                return line

    def invoke() -> httpx.Response:
        return httpx.post(
            f"http://127.0.0.1:{port}/v1/functions/echo/invoke", json={"x": [[1, 2, 3, 4]]}
        )

    try:
        assert "serving v-" in next_event()
        first = invoke()
        assert first.json() == {"y": [[2, 4, 6, 8]]}
        handler = folder / "handler.py"
        handler.write_text(handler.read_text().replace("2.0", "3.0"))
        line = next_event()
        assert "serving v-" in line
        second = invoke()
        assert second.json() == {"y": [[3, 6, 9, 12]]}
        assert second.headers["x-fnrt-version"] != first.headers["x-fnrt-version"]
        handler.write_text(handler.read_text() + "\nthis is not python(\n")
        line = next_event()
        assert "not deployed" in line and "SyntaxError" in line
        still = invoke()  # the last good version keeps serving
        assert still.json() == {"y": [[3, 6, 9, 12]]}
        assert still.headers["x-fnrt-version"] == second.headers["x-fnrt-version"]
        handler.write_text(handler.read_text().replace("this is not python(", ""))
        assert "serving v-" in next_event()
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
