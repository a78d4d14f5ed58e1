"""A worker's descendants end with it: every process its handler started, however.

A handler may start processes (``subprocess.Popen``, ``os.fork``, a shell that
backgrounds a ``setsid`` daemon and exits). Left alone they outlive the worker
and the node, reparented to PID 1, holding memory until the machine (or the
pod) goes. Three marks find them, since each alone misses some:

- the **process group**: a worker starts in a session and group of its own
  (``start_new_session``), which its children join; a ``setsid`` leaves it;
- the **tree**: the worker is a child subreaper (``PR_SET_CHILD_SUBREAPER``),
  so an orphan below it (its parent exited: a shell's background job) is
  reparented to the worker, not to PID 1, and stays its descendant while it lives;
- a **token** in the environment (``FNRT_WORKER_TOKEN``, a random value per
  worker) that every descendant inherits unless it clears its environment: the
  only mark left once the worker died and the tree was reparented away.

The worker sweeps its tree and group as it exits (:func:`sweep`). A worker
that dies abruptly (a segfault, ``SIGKILL`` from the node's memory or timeout
guard, the node's own death through ``PR_SET_PDEATHSIG``) cannot, so each
worker forks a **keeper** at its start (:func:`start_keeper`): a small copy of
it, in a group of its own, asleep until Linux tells it the worker died (its
own ``PR_SET_PDEATHSIG``), which then sweeps the worker's group and every
process carrying the token, and exits. Linux only: elsewhere none of this runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
from collections.abc import Collection, Mapping
from pathlib import Path

#: The environment variable a worker's descendants inherit, naming it (set by the node).
TOKEN_VARIABLE = "FNRT_WORKER_TOKEN"
#: How many times a sweep looks again (a process may fork while it is being killed).
SWEEP_PASSES = 8

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PROC = Path("/proc")


def with_token(env: Mapping[str, str] | None) -> dict[str, str]:
    """The environment for a new worker: ``env`` (None: the node's) with a fresh token."""
    return {**(os.environ if env is None else env), TOKEN_VARIABLE: secrets.token_hex(16)}


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def become_subreaper() -> bool:
    """Orphans below this process are reparented to it (not PID 1). False: not Linux."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def start_keeper(token: str) -> int | None:
    """Fork the keeper of this process (the worker): it waits for the worker's death,
    however it comes, then kills the worker's group and every process carrying
    ``token``. Its pid (spared by the worker's own sweep), or None where it cannot run."""
    if not _PROC.is_dir():
        return None
    worker = os.getpid()
    keeper = os.fork()
    if keeper:
        return keeper
    try:  # the keeper: nothing here may raise out of the fork, nor return
        os.setpgid(0, 0)  # out of the worker's group, which it will kill
        _close_inherited()  # holds nothing of the worker's (its socket above all)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        if _prctl(_PR_SET_PDEATHSIG, signal.SIGUSR1) and os.getppid() == worker:
            signal.sigwait({signal.SIGUSR1})  # until the worker is gone
        sweep(worker, token, spare={os.getpid()}, tree=False)
    finally:
        os._exit(0)


def _close_inherited() -> None:
    """Close every descriptor but the standard three."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            with contextlib.suppress(OSError):
                os.close(int(name))


def _table() -> dict[int, tuple[int, int]]:
    """Every process's (parent, group), by pid."""
    table = {}
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if fields and fields[0] != b"Z":  # a zombie is dead already
            table[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return table


def _carries(pid: int, token: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return token in f.read().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False


def _below(root: int, table: dict[int, tuple[int, int]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def sweep(root: int, token: str | None, spare: Collection[int] = (), *, tree: bool = True) -> int:
    """SIGKILL every process in ``root``'s process group, below it (``tree``), or
    carrying ``token`` in its environment, but ``root`` itself, this process and
    ``spare``; looked for again until none is left. How many were killed."""
    if not _PROC.is_dir():
        return 0
    mark = f"{TOKEN_VARIABLE}={token}".encode() if token else None
    keep = {root, os.getpid(), *spare}
    killed = 0
    for _ in range(SWEEP_PASSES):
        table = _table()
        doomed = {pid for pid, (_, group) in table.items() if group == root}
        if tree:
            doomed |= _below(root, table)
        if mark is not None:
            doomed |= {pid for pid in table if pid not in doomed and _carries(pid, mark)}
        doomed -= keep
        if not doomed:
            break
        for pid in doomed:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        _reap(doomed)
    return killed


def _reap(pids: Collection[int]) -> None:
    """Reap those of ``pids`` that are this process's children (no zombies left)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.waitpid(pid, 0)
