"""An instance's thread: calls in order on one thread, and a stuck call never blocks an exit."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from fnrt.loader.executor import InstanceThread


def test_calls_run_in_order_on_one_thread() -> None:
    executor = InstanceThread("fnrt-test")
    seen: list[tuple[int, str]] = []
    futures = [
        executor.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
        for i in range(5)
    ]
    for f in futures:
        f.result(5)
    assert [i for i, _ in seen] == [0, 1, 2, 3, 4]
    assert {name for _, name in seen} == {"fnrt-test"}
    with pytest.raises(ZeroDivisionError):
        executor.submit(lambda: 1 / 0).result(5)
    executor.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(print)


def test_a_stuck_call_does_not_keep_the_process_alive() -> None:
    code = (
        "import time\n"
        "from fnrt.loader.executor import InstanceThread\n"
        "e = InstanceThread('stuck')\n"
        "e.submit(time.sleep, 3600)\n"
        "e.shutdown(wait=False)\n"
    )
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    assert time.monotonic() - started < 20
