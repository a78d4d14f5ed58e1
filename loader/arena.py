"""Shared-memory arenas: how a batch's tensors cross to a worker process and back.

One side writes a batch's arrays into an arena (a file in ``/dev/shm``, mapped
by both processes) and sends only their layout — name, dtype, shape, offset —
over the control socket; the other side sees the arrays as numpy views of its
own mapping. No tensor byte is pickled or copied through a pipe. Each
direction has its own arena with a single writer, which grows the file when a
batch does not fit; the reader maps the larger file when a layout points past
its mapping. Element types without a fixed size (``bytes`` tensors, numpy
object arrays) travel inside the layout message instead, as msgpack does.

A batch of like requests (the same tensors, dtypes and shapes past the first
axis: what one manifest's checks let through) goes in as one block a tensor,
a single copy each, and each request reads its rows of it as a view: one
array call a tensor rather than two a request, on the server's event loop
and in the worker alike.

Triton's Python backend crosses the same boundary the same way (a shared
memory pool per stub process and tensor handles over a message queue).
"""

from __future__ import annotations

import functools
import math
import mmap
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fnrt.functions.dtypes import name_of, numpy_dtype

_ALIGN = 64
_MIN_BYTES = 1 << 20

#: One tensor in a layout: (request index, tensor name, dtype name, shape, offset).
Slot = tuple[int, str, str, list[int], int]
#: One object tensor in a layout: (request index, tensor name, shape, flat elements).
Inline = tuple[int, str, list[int], list[Any]]
#: One tensor of every request, stacked along the first axis in one block:
#: (tensor name, dtype name, shape past the first axis, offset, each request's rows).
Stack = tuple[str, str, list[int], int, list[int]]

#: Up to this many bytes, the requests of a stacked block copied out of the arena
#: share one copy (each a view of it); past it each gets its own, so that one kept
#: answer (in a result cache, say) does not hold its whole batch's memory.
SHARED_COPY_BYTES = 1 << 20


def shm_dir() -> Path:
    """Where arenas live: ``/dev/shm`` (memory) when it exists, else the temp folder."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    import tempfile

    return Path(tempfile.gettempdir())


class Arena:
    """One shared file, mapped; its writer grows it, its reader follows."""

    def __init__(self, path: Path, *, create: bool) -> None:
        self.path = path
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self._fd = os.open(path, flags, 0o600)
        if create:
            os.ftruncate(self._fd, _MIN_BYTES)
        self._map = mmap.mmap(self._fd, os.fstat(self._fd).st_size)

    @property
    def size_bytes(self) -> int:
        return len(self._map)

    def ensure(self, size_bytes: int) -> None:
        """Writer: make the file at least ``size_bytes`` long and map all of it."""
        if size_bytes > len(self._map):
            grown = max(size_bytes, 2 * len(self._map))
            os.ftruncate(self._fd, grown)
            self._remap(grown)

    def follow(self, size_bytes: int) -> None:
        """Reader: map at least ``size_bytes`` of the file (the writer grew it)."""
        if size_bytes > len(self._map):
            self._remap(os.fstat(self._fd).st_size)

    def _remap(self, size: int) -> None:
        # The old mapping stays valid for views still using it; it closes with them.
        self._map = mmap.mmap(self._fd, size)

    def write(self, arrays: Sequence[Mapping[str, np.ndarray[Any, Any]]]) -> dict[str, Any]:
        """Copy one batch's arrays in; the layout the reader needs to see them.

        A batch whose requests hold the same tensors (names, dtypes, and shapes past
        the first axis: the usual batch, checked against one manifest) goes in as
        one block a tensor, each a single copy; any other, an array at a time."""
        names = _stackable(arrays)
        if names is not None:
            return self._write_stacked(arrays, names)
        slots: list[Slot] = []
        inline: list[Inline] = []
        placed: list[tuple[int, np.ndarray[Any, Any]]] = []
        offset = 0
        for i, tensors in enumerate(arrays):
            for name, value in tensors.items():
                array = np.asarray(value)
                dtype = array.dtype
                dtype_name = name_of(dtype)
                if dtype_name is None or dtype.hasobject:  # bytes (object) among them
                    inline.append((i, name, list(array.shape), array.ravel().tolist()))
                    continue
                slots.append((i, name, dtype_name, list(array.shape), offset))
                nbytes = array.nbytes
                if nbytes:
                    placed.append((offset, array))
                offset += -(-nbytes // _ALIGN) * _ALIGN
        self.ensure(offset)
        buffer = self._map
        for at, array in placed:
            dtype = array.dtype
            if not dtype.isnative:  # written in the native byte order
                dtype = dtype.newbyteorder("=")
            np.ndarray(array.shape, dtype, buffer=buffer, offset=at)[...] = array
        return {"n": len(arrays), "slots": slots, "inline": inline, "arena_bytes": offset}

    def _write_stacked(
        self, arrays: Sequence[Mapping[str, np.ndarray[Any, Any]]], names: list[str]
    ) -> dict[str, Any]:
        stacks: list[Stack] = []
        blocks: list[tuple[int, list[np.ndarray[Any, Any]], tuple[int, ...], np.dtype[Any]]] = []
        offset = 0
        for name in names:
            parts = [tensors[name] for tensors in arrays]
            first = parts[0]
            dtype_name = name_of(first.dtype)
            assert dtype_name is not None  # _stackable's
            rows = [part.shape[0] for part in parts]
            shape = (sum(rows), *first.shape[1:])
            stacks.append((name, dtype_name, list(shape[1:]), offset, rows))
            dtype = first.dtype if first.dtype.isnative else first.dtype.newbyteorder("=")
            blocks.append((offset, parts, shape, dtype))
            offset += -(-(dtype.itemsize * math.prod(shape)) // _ALIGN) * _ALIGN
        self.ensure(offset)
        buffer = self._map
        for at, parts, shape, dtype in blocks:
            if shape[0]:
                np.concatenate(parts, out=np.ndarray(shape, dtype, buffer=buffer, offset=at))
        return {"n": len(arrays), "stacked": stacks, "arena_bytes": offset}

    def read(self, layout: Mapping[str, Any], *, copy: bool) -> list[dict[str, Any]]:
        """The batch a layout describes: views of the mapping, or copies with ``copy``
        (the writer reuses the arena for its next batch)."""
        self.follow(int(layout["arena_bytes"]))
        out: list[dict[str, Any]] = [{} for _ in range(int(layout["n"]))]
        stacked = layout.get("stacked")
        if stacked is not None:
            for name, dtype_name, shape, at, rows in stacked:
                self._read_stack(out, name, numpy_dtype(dtype_name), shape, at, rows, copy)
            return out
        for i, name, dtype_name, shape, at in layout["slots"]:
            dtype = numpy_dtype(dtype_name)
            if 0 in shape:
                out[i][name] = np.empty(tuple(shape), dtype)
                continue
            view = np.ndarray(tuple(shape), dtype, buffer=self._map, offset=at)
            if copy:
                view = view.copy()
            else:
                view.flags.writeable = False
            out[i][name] = view
        for i, name, shape, elements in layout["inline"]:
            array = np.empty(len(elements), dtype=object)
            array[:] = elements
            out[i][name] = array.reshape(shape)
        return out

    def _read_stack(
        self,
        out: list[dict[str, Any]],
        name: str,
        dtype: np.dtype[Any],
        shape: list[int],
        at: int,
        rows: list[int],
        copy: bool,
    ) -> None:
        """Each request its rows of one stacked block."""
        total = sum(rows)
        if not total or 0 in shape:
            block = np.empty((total, *shape), dtype)
        else:
            block = np.ndarray((total, *shape), dtype, buffer=self._map, offset=at)
            if not copy:
                block.flags.writeable = False
            elif block.nbytes <= SHARED_COPY_BYTES:
                block = block.copy()
            else:  # large: a copy of its own each
                start = 0
                for i, n in enumerate(rows):
                    out[i][name] = block[start : start + n].copy()
                    start += n
                return
        start = 0
        for i, n in enumerate(rows):
            out[i][name] = block[start : start + n]
            start += n

    def close(self, *, unlink: bool = False) -> None:
        """Close the file and let go of its mapping, which holds a descriptor of its own
        (mmap keeps a duplicate) and the file's memory: it closes now, or with the last
        view still reading it. Not left to the collector: an arena that outlives its
        worker (a reference left, a cycle a full collection has not reached yet) would
        keep both until then (four descriptors and arenas a death)."""
        os.close(self._fd)
        self._map = _closed_map()
        if unlink:
            self.path.unlink(missing_ok=True)


@functools.cache
def _closed_map() -> mmap.mmap:
    """What a closed arena maps: a closed mapping, so that any use says so."""
    closed = mmap.mmap(-1, 1)
    closed.close()
    return closed


def _stackable(arrays: Sequence[Mapping[str, Any]]) -> list[str] | None:
    """The tensor names of a batch that can go in stacked (see :meth:`Arena.write`):
    two requests or more, each with the same names, and each tensor an array of a
    fixed-size dtype fnrt names, of at least one axis, whose dtype and shape past
    the first axis agree across the requests. None for any other batch."""
    if len(arrays) < 2:
        return None
    first = arrays[0]
    kinds: list[tuple[str, np.dtype[Any], tuple[int, ...]]] = []
    for name, value in first.items():
        if type(value) is not np.ndarray or not value.ndim or value.dtype.hasobject:
            return None
        if name_of(value.dtype) is None:
            return None
        kinds.append((name, value.dtype, value.shape[1:]))
    count = len(kinds)
    ndarray = np.ndarray
    for tensors in arrays[1:]:
        if len(tensors) != count:
            return None
        for name, dtype, rest in kinds:
            value = tensors.get(name)
            if (
                type(value) is not ndarray
                or (value.dtype is not dtype and value.dtype != dtype)
                or value.shape[1:] != rest
            ):
                return None
    return [name for name, _, _ in kinds]
