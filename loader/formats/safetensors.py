"""safetensors files mapped, not read: tensors are views of the mapped file.

The file is mapped copy-on-write, so the pages come from the page cache (and
are shared between processes) until someone writes to a tensor, which then
gets a private copy of just that page.

A cold start maps the files ahead (:class:`MappedAhead`, from the start of the load)
when a core is idle (:func:`core_idle`): each mapping's page tables are filled
on a thread of its own (Linux's ``MADV_POPULATE_READ``, in parts, the GIL
released) while the handler is imported and built, and the handler's
:func:`arrays` or :func:`tensors` of that file takes the mapping made ahead.
With no core idle the filling would only take the load's own share of the CPU
(a worker is a session, so a scheduling group, of its own): measured here on a
saturated 2-core machine, wakes took 86 ms against 73 ms without it (8 rounds
interleaved). Otherwise its first forward maps the
weights' pages in page faults: on 256 MiB, 7.9 ms of CPU to read one byte a
page of a new mapping, against 1.2 ms once mapped (and 7.2 ms to fill it ahead),
medians of 10 on a shared 2-core machine.
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import struct
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from fnrt.functions.errors import FnrtError
from fnrt.functions.extras import require

_NUMPY_DTYPES = {
    "BOOL": np.bool_,
    "U8": np.uint8,
    "I8": np.int8,
    "U16": np.uint16,
    "I16": np.int16,
    "U32": np.uint32,
    "I32": np.int32,
    "U64": np.uint64,
    "I64": np.int64,
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "BF16": np.uint16,  # reinterpreted as bfloat16 for torch
}
_MAX_HEADER = 100 * 1024 * 1024

log = logging.getLogger("fnrt.loader")

#: Linux's madvise advice that fills a range's page tables from the page cache (5.14+).
MADV_POPULATE_READ = 22
#: How much of a mapping one madvise fills: the mmap lock is let go between parts, so
#: the load's own mmap and munmap calls (large allocations) never wait for a whole file.
POPULATE_STEP_BYTES = 4 << 20


def read_header(path: Path) -> tuple[int, dict[str, Any]]:
    """The byte offset where tensor data starts, and the parsed JSON header."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise FnrtError(f"{path} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw)
        if length > _MAX_HEADER:
            raise FnrtError(f"{path} is not a safetensors file (header of {length} bytes)")
        try:
            header: dict[str, Any] = json.loads(f.read(length))
        except ValueError:
            raise FnrtError(f"{path} is not a safetensors file (header is not JSON)") from None
    header.pop("__metadata__", None)
    return 8 + length, header


def arrays(path: Path, *, writable: bool = False) -> dict[str, np.ndarray[Any, Any]]:
    """Every tensor as a numpy view of the mapped file (BF16 as raw uint16); the mapping
    made ahead of this load (:class:`MappedAhead`) when there is one."""
    return _arrays(path, read_header(path), writable)


def _arrays(
    path: Path, read: tuple[int, dict[str, Any]], writable: bool
) -> dict[str, np.ndarray[Any, Any]]:
    start, header = read
    mapped = _take(path)
    if mapped is None:
        mapped = np.memmap(path, mode="c" if writable else "r", dtype=np.uint8)
    elif not writable:  # made copy-on-write: read-only views, as mode "r" gives
        mapped = mapped.view()
        mapped.flags.writeable = False
    out: dict[str, np.ndarray[Any, Any]] = {}
    for name, info in header.items():
        dtype = _NUMPY_DTYPES.get(info["dtype"])
        if dtype is None:
            raise FnrtError(f"{path}: tensor '{name}' has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        view: np.ndarray[Any, Any] = mapped[start + begin : start + end].view(dtype)
        out[name] = view.reshape(info["shape"])
    return out


#: Mappings made ahead of loads in this process, by path, until a load's arrays() takes one.
_ahead: dict[Path, list[np.memmap[Any, Any]]] = {}
_ahead_lock = threading.Lock()
_filling = threading.Condition()  # its count: fills in flight in this process
_fills = [0]


def core_idle(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> bool:
    """Whether a core this process may run on is idle now: fewer threads running on the
    machine (``/proc/loadavg``'s fourth field, the caller included) than such cores,
    which a cgroup's CPU quota (``cpu.max``, a container's limit) may make fewer than
    its affinity says. True where that cannot be read."""
    try:
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
        cores = float(len(os.sched_getaffinity(0)))
    except (OSError, ValueError, IndexError, AttributeError):
        return True
    return running < min(cores, quota_cores(cpu_max))


def quota_cores(cpu_max: Path) -> float:
    """The cores a cgroup v2 CPU quota allows (``cpu.max``: ``QUOTA PERIOD``, or
    ``max PERIOD``); infinity with none, or where it cannot be read."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
        return math.inf if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return math.inf


def settled(timeout_s: float) -> bool:
    """Wait until every mapping made ahead in this process has its page tables filled
    (or gave up); whether that was within ``timeout_s``."""
    with _filling:
        return _filling.wait_for(lambda: _fills[0] == 0, timeout_s)


def _take(path: Path) -> np.memmap[Any, Any] | None:
    with _ahead_lock:
        made = _ahead.get(Path(path))
        if not made:
            return None
        mapped = made.pop()
        if not made:
            del _ahead[Path(path)]
        return mapped


def _is_safetensors(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            raw = f.read(9)
    except OSError:  # a folder artifact, say: nothing to map ahead
        return False
    return len(raw) == 9 and struct.unpack("<Q", raw[:8])[0] <= _MAX_HEADER and raw[8:] == b"{"


class MappedAhead:
    """The safetensors files among ``paths`` mapped now (copy-on-write, as
    :func:`tensors` maps them) and their page tables filled on a thread of their
    own, for the load about to run in this process to take (:func:`arrays`); what
    it did not take is unmapped at :meth:`close`. Anything else is left alone."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self._made: list[tuple[Path, np.memmap[Any, Any]]] = []
        for path in dict.fromkeys(Path(p) for p in paths):  # two artifacts, one blob: once
            if not _is_safetensors(path):
                continue
            try:
                mapped = np.memmap(path, mode="c", dtype=np.uint8)
            except (OSError, ValueError):  # empty, or gone: the load says so itself
                continue
            self._made.append((path, mapped))
        with _ahead_lock:
            for path, mapped in self._made:
                _ahead.setdefault(path, []).append(mapped)
        self._filled = threading.Event()
        if self._made:
            ranges = [(m.ctypes.data, m.nbytes) for _, m in self._made]
            keep = [m for _, m in self._made]  # mapped until filled, taken or not
            with _filling:
                _fills[0] += 1
            try:
                threading.Thread(
                    target=self._fill, args=(ranges, keep), name="fnrt-premap", daemon=True
                ).start()
            except RuntimeError:  # no thread to be had: the first reads fault, as before
                self._filled_now()
        else:
            self._filled.set()

    @property
    def paths(self) -> list[Path]:
        """The files mapped ahead."""
        return [path for path, _ in self._made]

    def _fill(self, ranges: list[tuple[int, int]], keep: list[Any]) -> None:
        try:
            for address, size in ranges:
                if not populate(address, size):
                    return
        finally:
            self._filled_now()

    def _filled_now(self) -> None:
        self._filled.set()
        with _filling:
            _fills[0] -= 1
            _filling.notify_all()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until the page tables are filled; whether they were within ``timeout_s``."""
        return self._filled.wait(timeout_s)

    def close(self) -> None:
        """The load is over: the mappings it did not take are dropped (unmapped once
        their filling ends)."""
        with _ahead_lock:
            for path, mapped in self._made:
                made = _ahead.get(path, [])
                if any(m is mapped for m in made):
                    made[:] = [m for m in made if m is not mapped]
                    if not made:
                        del _ahead[path]


def populate(address: int, size: int) -> bool:
    """Fill the page tables of a mapping's ``size`` bytes from ``address`` (page cache
    pages, mapped read-only), in parts of ``POPULATE_STEP_BYTES``, the GIL released;
    False where Linux cannot (before 5.14, not Linux): then the first reads fault, as
    they would have."""
    madvise = _madvise()
    if madvise is None:
        return False
    for offset in range(0, size, POPULATE_STEP_BYTES):
        length = min(POPULATE_STEP_BYTES, size - offset)
        if madvise(address + offset, length, MADV_POPULATE_READ) != 0:
            errno = ctypes.get_errno()
            log.debug("populating a mapping stopped: %s", os.strerror(errno))
            return False
    return True


_libc: list[Any] = []


def _madvise() -> Any:
    """libc's madvise through ctypes (which lets the GIL go during the call), or None."""
    if not _libc:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            madvise = libc.madvise
            madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            madvise.restype = ctypes.c_int
        except (OSError, AttributeError):
            madvise = None
        _libc.append(madvise)
    return _libc[0]


def tensors(path: Path, device: str = "cpu") -> dict[str, Any]:
    """Every tensor as a ``torch.Tensor`` sharing memory with the mapped file.

    On ``cpu`` nothing is copied; on a GPU each tensor is copied once to the device.
    """
    torch = require("torch", "safetensors as torch tensors")

    read = read_header(path)
    header = read[1]
    out: dict[str, Any] = {}
    for name, array in _arrays(path, read, True).items():
        tensor = torch.from_numpy(array)
        if header[name]["dtype"] == "BF16":
            tensor = tensor.view(torch.bfloat16)
        out[name] = tensor if device == "cpu" else tensor.to(device, non_blocking=True)
    return out


_DTYPE_NAMES = {np.dtype(v).str: k for k, v in _NUMPY_DTYPES.items() if k != "BF16"}


def save_arrays(arrays: dict[str, np.ndarray[Any, Any]], path: Path) -> None:
    """Write numpy arrays as a safetensors file (readable by the ``safetensors`` package)."""
    header: dict[str, Any] = {}
    offset = 0
    ordered = sorted(arrays.items())
    for name, array in ordered:
        array = np.ascontiguousarray(array)
        key = array.dtype.newbyteorder("<").str if array.dtype.byteorder == ">" else array.dtype.str
        if key not in _DTYPE_NAMES:
            raise FnrtError(f"tensor '{name}': dtype {array.dtype} has no safetensors name")
        header[name] = {
            "dtype": _DTYPE_NAMES[key],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, array in ordered:
            f.write(np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes())
