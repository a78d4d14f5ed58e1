"""Weights from the disk cache (L2) to device memory: parallel reads into a pinned ring,
each chunk copied to the device as soon as it is full.

The file is read by several threads with ``pread`` into a ring of page-locked
chunks; the calling thread queues each full chunk's copy to its place in one
device allocation on a copy stream, and records an event after it. A reader
fills a chunk again only after that event: the disk keeps reading while the
copy engine copies, and no byte is copied twice on the host. A safetensors
file's tensors are then views of that device memory (``safetensors_to_device``).

This is ServerlessLLM's loader (OSDI 2024) in Python: ``pread`` releases the
GIL, and the copies are asynchronous, so a few threads keep a disk or the page
cache busy. On the CPU (``Lanes()``) the same code copies into host memory,
which is how it is tested without a GPU; a CPU instance maps its weights
instead (``formats/safetensors.py``), which costs no copy at all.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fnrt.functions.errors import FnrtError
from fnrt.functions.extras import require
from fnrt.functions.handler import Device
from fnrt.loader.formats.safetensors import read_header
from fnrt.loader.streams import Event, HostBuffer, Lanes, lanes_for

MIB = 1024 * 1024


@dataclass(frozen=True)
class TransferConfig:
    """How a file is brought to the device: chunk size, ring length, reader threads."""

    chunk_bytes: int = 32 * MIB
    ring_chunks: int = 8
    readers: int = 8  # reads in flight: what keeps an NVMe disk busy (they wait, not compute)

    def __post_init__(self) -> None:
        if self.chunk_bytes < 4096 or self.ring_chunks < 2 or self.readers < 1:
            raise ValueError("chunk_bytes >= 4096, ring_chunks >= 2 and readers >= 1")


@dataclass(frozen=True)
class Transferred:
    """What one transfer moved and how long it took."""

    nbytes: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class _Ring:
    """The chunks of one page-locked allocation, kept for the process (allocating
    page-locked memory costs far more than a load's reads)."""

    def __init__(self, lanes: Lanes, config: TransferConfig) -> None:
        self.config = config
        self.whole = lanes.host_buffer(config.chunk_bytes * config.ring_chunks)
        size = config.chunk_bytes
        self.chunks = [
            HostBuffer(self.whole.array[i * size : (i + 1) * size])
            for i in range(config.ring_chunks)
        ]
        self.lock = threading.Lock()  # one transfer at a time uses the ring


_rings: dict[tuple[str, TransferConfig], _Ring] = {}
_rings_lock = threading.Lock()


def pinned_ring_bytes() -> int:
    """Page-locked host memory this process's rings hold (kept for the process): what
    the host budget counts for a worker that loaded weights to a GPU."""
    with _rings_lock:
        return sum(ring.whole.nbytes for ring in _rings.values() if ring.whole.pinned)


def _ring(lanes: Lanes, config: TransferConfig) -> _Ring:
    key = (str(lanes.device) if lanes.on_gpu else "cpu", config)
    with _rings_lock:
        ring = _rings.get(key)
        if ring is None:
            ring = _rings[key] = _Ring(lanes, config)
        return ring


def read_to_device(
    path: Path,
    offset: int,
    nbytes: int,
    dst_pointer: int,
    lanes: Lanes,
    config: TransferConfig = TransferConfig(),
) -> Transferred:
    """Copy ``nbytes`` of ``path`` from ``offset`` to device memory at ``dst_pointer``
    (host memory on the CPU's lanes); returns once the bytes are there."""
    start = time.perf_counter()
    if nbytes == 0:
        return Transferred(0, 0.0)
    ring = _ring(lanes, config)
    size = config.chunk_bytes
    count = -(-nbytes // size)
    slots = len(ring.chunks)
    events: list[Event] = [lanes.event() for _ in range(slots)]
    turn = list(range(slots))  # the chunk each ring slot takes next
    changed = threading.Condition()
    filled: queue.SimpleQueue[int | BaseException] = queue.SimpleQueue()
    next_chunk = iter(range(count))
    taking = threading.Lock()
    failed = threading.Event()

    def read_all(fd: int) -> None:
        try:
            while not failed.is_set():
                with taking:
                    index = next(next_chunk, None)
                if index is None:
                    return
                slot = index % slots
                with changed:
                    while turn[slot] != index and not failed.is_set():
                        changed.wait()
                events[slot].synchronize()  # the copy out of this slot is done
                length = min(size, nbytes - index * size)
                _pread_fully(fd, ring.chunks[slot].array[:length], offset + index * size, path)
                filled.put(index)
        except BaseException as exc:
            failed.set()
            filled.put(exc)

    with ring.lock:
        fd = os.open(path, os.O_RDONLY)
        readers = [
            threading.Thread(target=read_all, args=(fd,), name=f"fnrt-read-{i}", daemon=True)
            for i in range(min(config.readers, count))
        ]
        try:
            for reader in readers:
                reader.start()
            for _ in range(count):
                got = filled.get()
                if isinstance(got, BaseException):
                    raise got
                slot = got % slots
                length = min(size, nbytes - got * size)
                lanes.to_device(dst_pointer + got * size, ring.chunks[slot], length, lanes.copy)
                events[slot].record(lanes.copy)
                with changed:
                    turn[slot] = got + slots
                    changed.notify_all()
            lanes.copy.synchronize()
        finally:
            failed.set()
            with changed:
                changed.notify_all()
            for reader in readers:
                reader.join()
            os.close(fd)
            for event in events:
                event.close()
    return Transferred(nbytes, time.perf_counter() - start)


def _pread_fully(fd: int, into: Any, offset: int, path: Path) -> None:
    view = memoryview(into).cast("B")
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise FnrtError(f"{path} ended {len(view) - done} bytes early")
        done += got


def safetensors_to_device(
    path: Path,
    device: Device,
    config: TransferConfig = TransferConfig(),
    lanes: Lanes | None = None,
) -> dict[str, Any]:
    """Every tensor of a safetensors file as a torch tensor in ``device``'s memory: one
    allocation filled by :func:`read_to_device`, each tensor a view of it (a tensor
    whose offset does not suit its element size is copied once, on the device)."""
    torch = require("torch", "safetensors on a GPU")
    start, header = read_header(path)
    nbytes = path.stat().st_size - start
    memory = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device.torch)
    own = lanes is None
    lanes = lanes if lanes is not None else lanes_for(device)
    try:
        read_to_device(path, start, nbytes, memory.data_ptr(), lanes, config)
    finally:
        if own:
            lanes.close()
    out: dict[str, Any] = {}
    for name, info in header.items():
        dtype = _TORCH_DTYPES.get(info["dtype"])
        if dtype is None:
            raise FnrtError(f"{path}: tensor '{name}' has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        raw = memory[begin:end]
        dtype = getattr(torch, dtype)
        itemsize = torch.empty(0, dtype=dtype).element_size()
        if begin % itemsize:
            raw = raw.clone()
        out[name] = raw.view(dtype).view(info["shape"])
    return out


_TORCH_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
}
