"""CPU priority of a spare worker's warming: its imports yield to serving.

A spare started to replace one a cold start took (``spares.py``) imports the
frameworks handlers use (torch: a core for a second or more) while the node
serves the function whose cold start took it: on two cores, measured with a
32-connection burst right after a deploy of a function with no warm-up, the
replacement's imports held 0.3-0.45 of a core for about 5 s of the burst's 10,
and the server's share dropped to match. Such a spare does its imports on a
thread of its own at the lowest priority (``LOW_NICE``), so it takes only the
CPU that serving leaves; its main thread, which serves once it is given a
function, keeps the server's priority throughout.

A thread's nice value weighs only against the threads of its own scheduling
group. With autogroups on (``/proc/sys/kernel/sched_autogroup_enabled``, the
default of most distributions, for processes in the root CPU cgroup) every
session is a group, and a worker starts a session of its own: its group
competes with the server's as an equal whatever its threads' nice values
(measured: the nice-19 import thread alone took as much of the burst as at
nice 0). So the server lowers a replacement's session's group as it starts it
(``/proc/PID/autogroup``, :func:`set_group_nice`: its interpreter's own start
and fnrt's imports, about 0.5 s of a core, run low too), and the spare raises
it back to 0 (where a session's group starts) once its imports are done;
raising a group back to 0 needs no privilege, only a tenth of a second
between any two writes on the machine.

On Linux a nice value belongs to a thread, and threads inherit their creator's:
the imports run on a thread whose nice is raised, and the threads they start
(``import torch`` starts none; torch's intra-op threads start in the rehearsal,
on the main thread) would inherit it, so :func:`restore` brings every thread of
the worker back to the server's priority when that is allowed. Lowering a nice
value needs ``CAP_SYS_NICE`` or a ``RLIMIT_NICE`` that permits it
(:func:`may_raise`): without either, a spare's import thread is not lowered at
all, only its session's group (which any process may raise back to 0), so a
cold start that finds it still warming raises the group and takes it, as with
the right (a thread left at nice 19 could not be raised, and the cold start
would start a worker of its own beside it rather than wait: two importing at
once). A worker whose threads stayed low anyway says so in its log. A module
that can only be imported on a main thread (one that sets signal handlers as
it is imported) fails on the import thread: it is left to the handler's own
import, as any import ahead that fails is.
"""

from __future__ import annotations

import errno
import functools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

#: The nice value a spare's imports run at, above the server's (the lowest priority).
LOW_NICE = 19
#: How long a write to an autogroup's nice value is tried again while the kernel
#: answers EAGAIN (it takes one write a tenth of a second on the whole machine).
GROUP_RETRY_S = 1.0


def group_nice(pid: int) -> int | None:
    """The nice value of the autogroup of process ``pid`` (None: no autogroups here, or
    it exited)."""
    try:
        text = Path(f"/proc/{pid}/autogroup").read_text()
    except OSError:
        return None
    fields = text.split()
    return int(fields[-1]) if len(fields) >= 3 and fields[-2] == "nice" else None


def set_group_nice(pid: int, nice: int) -> bool:
    """Set the nice value of the autogroup (the session's scheduling group) of process
    ``pid``; whether it was set (False: no autogroups here, it exited, or a value
    below 0 without the right to it)."""
    path = Path(f"/proc/{pid}/autogroup")
    deadline = time.monotonic() + GROUP_RETRY_S
    while True:
        try:
            path.write_text(str(nice))
            return True
        except OSError as exc:
            if exc.errno != errno.EAGAIN or time.monotonic() > deadline:
                return False
        time.sleep(0.02)  # the kernel's rate limit: a tenth of a second between writes


def thread_nices(pid: int) -> dict[int, int]:
    """The nice value of each live thread of process ``pid``, by thread id."""
    found: dict[int, int] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:  # it exited
        return found
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        found[int(task.name)] = int(stat[stat.rindex(")") + 2 :].split()[16])
    return found


def in_background(work: Callable[[], None], nice: int) -> None:
    """Run ``work`` on a thread of its own whose nice value is ``nice`` above this
    thread's, and wait for it; what it raised is raised here."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), own_nice() + nice)
            work()
        except BaseException as exc:  # handed to the caller
            failed.append(exc)

    thread = threading.Thread(target=run, name="fnrt-warming", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


@functools.cache
def may_raise() -> bool:
    """Whether this process may bring a thread's nice value back down once raised
    (``CAP_SYS_NICE``, or a ``RLIMIT_NICE`` that reaches this thread's): tried once, on
    a thread of its own."""
    allowed: list[bool] = []

    def probe() -> None:
        tid, nice = threading.get_native_id(), own_nice()
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice + 1)
            os.setpriority(os.PRIO_PROCESS, tid, nice)
            allowed.append(True)
        except PermissionError:
            allowed.append(False)

    thread = threading.Thread(target=probe, name="fnrt-nice-probe", daemon=True)
    thread.start()
    thread.join()
    return bool(allowed and allowed[0])


def own_nice() -> int:
    """The calling thread's nice value."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def restore(pid: int, nice: int | None = None) -> bool:
    """Bring every thread of process ``pid`` whose nice value is above ``nice`` (None:
    its main thread's) back to it, and its autogroup to 0 where it is above; whether no
    thread is left above it (False: not allowed here, see the module's note). A
    process that ended has none."""
    grouped = group_nice(pid)
    if grouped is not None and grouped > 0:
        set_group_nice(pid, 0)
    nices = thread_nices(pid)
    if nice is None:
        nice = nices.get(pid, 0)
    for tid, value in nices.items():
        if value > nice:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            except ProcessLookupError:  # the thread ended meanwhile
                continue
            except PermissionError:
                return False
    return True
