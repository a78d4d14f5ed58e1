"""Shared-memory arenas: how a batch's tensors cross to a worker process and back.

One side writes a batch's arrays into an arena (a file in ``/dev/shm``, mapped
by both processes) and sends only their layout — name, dtype, shape, offset —
over the control socket; the other side sees the arrays as numpy views of its
own mapping. No tensor byte is pickled or copied through a pipe. Each
direction has its own arena with a single writer, which grows the file when a
batch does not fit; the reader maps the larger file when a layout points past
its mapping. Element types without a fixed size (``bytes`` tensors, numpy
object arrays) travel inside the layout message instead, as msgpack does.

Triton's Python backend crosses the same boundary the same way (a shared
memory pool per stub process and tensor handles over a message queue).
"""

from __future__ import annotations

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
        """Copy one batch's arrays in; the layout the reader needs to see them."""
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

    def read(self, layout: Mapping[str, Any], *, copy: bool) -> list[dict[str, Any]]:
        """The batch a layout describes: views of the mapping, or copies with ``copy``
        (the writer reuses the arena for its next batch)."""
        self.follow(int(layout["arena_bytes"]))
        out: list[dict[str, Any]] = [{} for _ in range(int(layout["n"]))]
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

    def close(self, *, unlink: bool = False) -> None:
        os.close(self._fd)
        if unlink:
            self.path.unlink(missing_ok=True)
