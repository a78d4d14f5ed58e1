"""The worker process of an instance in process isolation.

Started as ``python -m fnrt.loader.worker FD PPID [--spare a,b [--nice N] --ready FD]
[--site DIR]``: a spare worker (``spares.py``) imports those modules (on a thread N
below its priority when given: ``priority.py``) and rehearses a cold start
(:func:`rehearse`) before it waits for its function, then writes a byte to the
``--ready`` pipe (the server waits on it); ``--site`` names the folder of its
``[environment]``'s packages, whose modules a load reports as installed too (what
a spare of that environment imports ahead).

The server materialises the version's files into its disk cache, then starts
this process with one end of a socket pair. The worker imports the handler
and maps the artifacts itself from those files, so workers of one model share
its weight pages through the page cache. It then serves batches one at a
time: inputs are views of the request arena, outputs are written into the
response arena, and only their layout crosses the socket (``arena.py``).
A generative handler's steps go the same way (``op: step``): the joining
sequences' inputs in the request arena, each step's chunks in the response
arena (``stepper.py`` keeps the active sequences here, in the worker).

The worker dies with the server (``PR_SET_PDEATHSIG``) and ignores Ctrl-C
(the server stops it in order); every process its handler starts ends with it
(``descendants.py``). It imports numpy, msgpack and the handler's
own dependencies; nothing of the HTTP side.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import logging
import os
import pickle
import queue
import signal
import socket
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np

from fnrt.functions.errors import FnrtError
from fnrt.functions.generation import Joining, StepBatch
from fnrt.functions.handler import Device, Request, bundle_package, import_handler
from fnrt.functions.manifest import parse_manifest
from fnrt.functions.version import FileRef, VersionManifest
from fnrt.loader.arena import Arena, shm_dir
from fnrt.loader.artifact import LocalArtifact
from fnrt.loader.channel import Channel, ChannelClosed
from fnrt.loader.descendants import TOKEN_VARIABLE, become_subreaper, start_keeper, sweep
from fnrt.loader.device import context_cost, free_bytes_now, process_device_bytes
from fnrt.loader.imports import from_site, site_roots
from fnrt.loader.instance import Built, Ran, build_handler, run_checked
from fnrt.loader.priority import (
    LOW_NICE,
    group_nice,
    in_background,
    may_raise,
    restore,
    set_group_nice,
    thread_nices,
)
from fnrt.loader.staging import Stager
from fnrt.loader.transfer import pinned_ring_bytes
from fnrt.tracing.handler_spans import capture

log = logging.getLogger("fnrt.worker")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask Linux to kill this process when the server dies, however it dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the closed socket ends the worker
        return


def private_bytes(pid: int | str = "self") -> int:
    """A process's anonymous resident memory (``RssAnon``: its heap, its interpreter's
    objects; no file it maps and no library it shares), 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024  # in kB
    except (OSError, IndexError, ValueError):
        pass
    return 0


def _failure(exc: BaseException) -> dict[str, Any]:
    return {
        "ok": False,
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": "".join(traceback.format_exception(exc)),
    }


def installed_imports(before: set[str], sites: Iterable[str] = ()) -> list[str]:
    """The top-level modules imported since ``before`` (names in ``sys.modules``) that come
    from installed packages (site-packages, or the ``[environment]`` folders ``sites``):
    what a spare worker may import ahead. A handler's own modules, or anything found on
    a path of its own, are not: imported ahead from elsewhere, a module of the same
    name would shadow them."""
    found = []
    for name in sorted({m.partition(".")[0] for m in sys.modules.keys() - before}):
        module = sys.modules.get(name)
        where = getattr(module, "__file__", None)
        if name.startswith("_") or name == "fnrt" or not where:
            continue
        if from_site(where, sites):
            found.append(name)
    return found


def import_ahead(names: list[str]) -> None:
    """Import ``names`` (a spare worker, before it is given a function); one that fails
    is left to the handler's own import, which will say why."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # anything an import raises
            log.info(
                "a spare worker did not import %s ahead (%s): --worker-imports names it, "
                "or handlers served before with this --cache-dir imported it (noted in its "
                "spares/imports.json); harmless unless a handler needs it, and then that "
                "handler's load says why",
                name,
                exc,
            )


#: What a spare rehearses a cold start with: a manifest, and its handler's code.
_REHEARSAL = {
    "name": "rehearsal",
    "handler": "handler:Handler",
    "inputs": {"x": {"dtype": "float32", "shape": [-1, 4]}},
    "outputs": {"y": {"dtype": "float32", "shape": [-1, 4]}},
}
_REHEARSAL_HANDLER = """
class Handler:
    def load(self, artifacts, device):
        pass

    def __call__(self, batch):
        return [{"y": r["x"]} for r in batch]
"""


def rehearse() -> None:
    """Run what a cold start runs first in a fresh interpreter, so that its first-time
    costs are a spare's and not the caller's: a version manifest unpickled, a handler
    imported from a bundle and built, a batch read from an arena, run and checked, and
    its results written back; and (torch imported) a module built on the ``meta``
    device, given tensors with ``load_state_dict(assign=True)`` and run once, as a torch
    handler's ``load`` and first batch do, and a layer large enough to start torch's
    intra-op threads (a first batch would start them otherwise). About 3 ms of a cold
    start of a torch model, measured, and the threads about 1 ms of its first forward
    (median of 8 fresh processes); nothing of it stays but warm caches and threads."""
    vm = VersionManifest(parse_manifest(_REHEARSAL), FileRef("", "0" * 64, 0))
    vm = pickle.loads(pickle.dumps(vm, pickle.HIGHEST_PROTOCOL))  # as a load message has it
    package = bundle_package(vm.bundle.digest)
    x = np.zeros((1, 4), dtype=np.float32)
    with tempfile.TemporaryDirectory(dir=shm_dir()) as folder:
        (Path(folder) / "handler.py").write_text(_REHEARSAL_HANDLER)
        arena = Arena(Path(folder) / "arena", create=True)
        batch: list[Request] = []
        try:
            built = build_handler(vm, Path(folder), {}, Device("cpu", 0))
            batch = cast(list[Request], arena.read(arena.write([{"x": x}, {"x": x}]), copy=False))
            arena.write(run_checked(built.call, vm, batch).results)
        finally:
            del batch  # views of the arena
            arena.close()
            for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
                del sys.modules[name]
    torch = sys.modules.get("torch")
    if torch is not None:
        with torch.device("meta"):
            module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        weights = {k: torch.zeros(v.shape) for k, v in module.state_dict().items()}
        module.load_state_dict(weights, assign=True)
        with torch.inference_mode():
            module(torch.from_numpy(x))
            # big enough to be split across torch's intra-op threads, which start now
            torch.nn.functional.linear(torch.ones(1, 1024), torch.ones(1024, 1024))
    site_roots()


def serve(channel: Channel, sites: Iterable[str] = ()) -> int:
    """Load as the first message says, then answer batches until told to close;
    ``sites``: the folders of its ``[environment]``'s packages."""
    before = set(sys.modules)  # while it waits: a spare's imports are done (0.2 ms)
    start = channel.recv()
    vm = pickle.loads(start["version"])  # from the server that started this worker
    assert isinstance(vm, VersionManifest)
    device = Device(start["device"][0], int(start["device"][1]))
    artifacts = {
        key: LocalArtifact(key, Path(path), digest, int(size), device)
        for key, (path, digest, size) in start["artifacts"].items()
    }
    requests = [Arena(Path(path), create=False) for path in start["requests"]]
    responses = [Arena(Path(path), create=False) for path in start["responses"]]
    free_before = free_bytes_now(device)  # before this process's CUDA context exists
    # what the worker holds before the handler's own: its interpreter and what it
    # imported (a spare's: what it learned the versions import, torch say)
    interpreter_bytes = private_bytes()
    try:
        built = build_handler(
            vm, Path(start["code_dir"]), artifacts, device, map_ahead=bool(start.get("map_ahead"))
        )
        on_device = process_device_bytes(device, free_before)  # context, workspaces, cache
    except Exception as exc:
        channel.send(_failure(exc))
        return 1
    # What the imports and the load made lives as long as the worker: out of the
    # collector, so that no collection during a batch walks it (a full one takes tens
    # of milliseconds with torch imported: a batch's p99), as the server does after a load.
    gc.freeze()
    channel.send(
        {
            "ok": True,
            "pid": os.getpid(),
            "size_bytes": built.size_bytes,
            "device_bytes": built.device_bytes,
            "context_bytes": context_cost(on_device, built.device_bytes),
            "pinned_bytes": pinned_ring_bytes(),
            "interpreter_bytes": interpreter_bytes,
            "staged": built.stager is not None,
            "import_s": built.import_s,
            "load_s": built.load_s,
            "modules": installed_imports(before, sites),
        }
    )
    messages: Iterator[tuple[dict[str, Any], Any]] = (
        _staging_ahead(channel, built.stager, requests)
        if built.stager is not None
        else _in_turn(channel)
    )
    for message, staged in messages:
        if message["op"] == "close":
            if built.unload is not None:
                try:
                    built.unload()
                except Exception as exc:
                    channel.send(_failure(exc))
                    return 1
            channel.send({"ok": True})
            return 0
        pair = message["pair"]
        trace = message.get("trace")
        if message["op"] == "step":
            channel.send(_step(built, requests[pair], responses[pair], message, trace))
            continue
        spans: list[dict[str, Any]] = []
        try:
            if trace:
                with capture((trace[0], trace[1])) as spans:
                    ran = _batch(built, vm, requests[pair], message, staged)
            else:  # not traced (the common case): nothing to set up
                ran = _batch(built, vm, requests[pair], message, staged)
        except Exception as exc:
            channel.send(_failure(exc))
            continue
        layout = responses[pair].write(ran.results)
        reply = {"ok": True, "infer_s": ran.infer_s, "output_s": ran.output_s, **layout}
        if spans:  # only a traced batch whose handler made spans has any
            reply["spans"] = spans
        channel.send(reply)
    return 0


def _batch(
    built: Built, vm: VersionManifest, requests: Arena, message: dict[str, Any], staged: Any
) -> Ran:
    """One batch run: read from its request arena and handed to the handler, or (a
    ``forward`` handler) computed as the reading thread staged it."""
    if built.stager is not None:
        return _computed(built.stager, staged)
    batch = cast(list[Request], requests.read(message, copy=False))
    # the request arena is the server's to overwrite once this returns (the batch is
    # dropped with this frame)
    return run_checked(built.call, vm, batch)


def _in_turn(channel: Channel) -> Iterator[tuple[dict[str, Any], Any]]:
    """Each message as it comes (the next one waits in the socket meanwhile, its batch
    in the other request arena), until the server closes the channel."""
    while True:
        try:
            yield channel.recv(), None
        except ChannelClosed:
            return


def _staging_ahead(
    channel: Channel, stager: Stager, requests: list[Arena]
) -> Iterator[tuple[dict[str, Any], Any]]:
    """Each message with its batch staged (a ``forward`` handler): a thread of its own
    (the stager's host lane) reads the messages and stages each batch as it comes,
    stacked into a slot (page-locked on a GPU) and its copy to the device queued on the
    copy stream, while this thread computes the one before. What came: (message, the
    staged batch or the exception that staging raised)."""
    came: queue.SimpleQueue[tuple[dict[str, Any], Any] | None] = queue.SimpleQueue()

    def read() -> None:
        while True:
            try:
                message = channel.recv()
            except ChannelClosed:
                came.put(None)
                return
            staged: Any = None
            if message["op"] == "run":
                try:
                    batch = requests[message["pair"]].read(message, copy=False)
                    staged = stager.stage(cast(list[Request], batch))
                    del batch  # stacked into the slot: the arena is the server's again
                except Exception as exc:
                    staged = exc
            came.put((message, staged))
            if message["op"] == "close":
                return

    threading.Thread(target=read, name="fnrt-stage", daemon=True).start()
    while (item := came.get()) is not None:
        yield item


def _computed(stager: Stager, staged: Any) -> Ran:
    """A batch the reading thread staged: computed on the instance's streams, checked."""
    if isinstance(staged, BaseException):
        raise staged
    results, times = stager.compute(staged)
    return Ran(results, times.compute_s, times.output_s)


def _step(
    built: Built, requests: Arena, responses: Arena, message: dict[str, Any], trace: Any
) -> dict[str, Any]:
    """One step of a generative handler; the reply to send."""
    if built.stepper is None:
        return _failure(RuntimeError("not a generative handler"))
    # copied: a sequence keeps its inputs for many steps, the arena only until the next
    inputs = requests.read(message, copy=True)
    joining = [
        Joining(int(id_), inp, params, int(max_new))
        for (id_, params, max_new), inp in zip(message["joining"], inputs, strict=True)
    ]
    try:
        with capture((trace[0], trace[1]) if trace else None) as spans:
            stepped = built.stepper(StepBatch(joining, list(message["leaving"])))
    except Exception as exc:
        return _failure(exc)
    layout = responses.write(stepped.outputs)
    reply = {
        "ok": True,
        "ids": stepped.ids,
        "ended": stepped.ended,
        "infer_s": stepped.infer_s,
        "output_s": stepped.output_s,
        **layout,
    }
    if spans:
        reply["spans"] = spans
    return reply


def check(code_dir: Path) -> int:
    """Import a version's handler and check its contract (deploy-time, in the function's
    environment); the version manifest comes on stdin. Exit 0, or 1 with the error."""
    vm = VersionManifest.from_dict(json.loads(sys.stdin.read()))
    try:
        import_handler(code_dir, vm.manifest, bundle_package(vm.bundle.digest))
    except FnrtError as exc:
        print(exc.message, file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--check"]:
        return check(Path(argv[2]))
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s fnrt-worker[{os.getpid()}] %(message)s"
    )
    if os.getppid() != int(argv[2]):  # the server died before the death signal was armed
        return 1
    token = os.environ.get(TOKEN_VARIABLE)
    keeper = None
    if token is not None:  # what the handler starts ends with this worker
        become_subreaper()
        keeper = start_keeper(token)
    try:
        return _serve(argv)
    finally:
        if token is not None:
            sweep(os.getpid(), token, spare=(keeper,) if keeper else ())


def _serve(argv: list[str]) -> int:
    channel = Channel(socket.socket(fileno=int(argv[1])), read_ahead=True)  # its only reads: recv
    # --spare NAMES, --nice N, --ready FD, --site DIR
    options = dict(zip(argv[3::2], argv[4::2], strict=False))
    if "--spare" in options:
        names = [name for name in options["--spare"].split(",") if name]
        nice = int(options.get("--nice", "0"))
        if nice:  # a replacement: its imports take only what serving leaves (priority.py)
            # its session's group, what meets the server's: lowered by the server as it
            # started (its interpreter's own start), at 0 again once the imports are done
            grouped = group_nice(os.getpid())
            if grouped is not None and grouped < min(nice, LOW_NICE):
                set_group_nice(os.getpid(), min(nice, LOW_NICE))
            # its import thread too, unless no one here may raise it back (no
            # CAP_SYS_NICE): then a cold start could not hurry it, and would start a
            # worker of its own beside it; the group alone, which any may raise, is low
            thread_nice = nice if may_raise() else 0
            try:
                in_background(lambda: import_ahead(names), thread_nice)
            finally:
                if grouped is not None:
                    set_group_nice(os.getpid(), 0)  # where a session's group starts
            if not restore(os.getpid()):
                log.warning(
                    "a spare's imports left threads at a low priority (not allowed to raise "
                    "them back: CAP_SYS_NICE or RLIMIT_NICE): %s",
                    thread_nices(os.getpid()),
                )
        else:
            import_ahead(names)
        try:
            rehearse()
        except Exception as exc:  # a rehearsal only warms caches: the load goes on
            log.warning("a spare's rehearsal failed: %s", exc)
        gc.collect()  # now, not in the middle of the load
        gc.freeze()
    if "--ready" in options:  # warm: the server may count on it now
        ready = int(options["--ready"])
        with contextlib.suppress(OSError):  # the server gave up on it: its load says
            os.write(ready, b"1")
        os.close(ready)
    try:
        return serve(channel, [options["--site"]] if "--site" in options else [])
    except ChannelClosed:
        return 0


if __name__ == "__main__":
    code = main(sys.argv)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # now: threads the handler left running must not hold the worker
