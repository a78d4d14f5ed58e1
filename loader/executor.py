"""The one thread an instance runs on: an executor whose thread never holds up an exit.

``ThreadPoolExecutor`` joins its threads when the interpreter exits, so a
handler stuck in a call (the instance was abandoned after its timeout) would
keep a stopping server alive forever. This executor's thread is a daemon: a
stopping process leaves it behind. One thread, calls in order, like
``ThreadPoolExecutor(1)``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_STOP = object()


class InstanceThread(Executor):
    """A single daemon thread running submitted calls in order."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._shutdown = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new calls after shutdown")
            future: Future[T] = Future()
            self._calls.put((future, fn, args, kwargs))
            return future

    def _run(self) -> None:
        while True:
            item = self._calls.get()
            if item is _STOP:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            self._calls.put(_STOP)
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()
