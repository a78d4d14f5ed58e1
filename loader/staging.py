"""Staged batches: fnrt stacks a batch's inputs, copies them to the device and runs the
handler's ``forward`` on them, with batch k+1 staged while batch k computes.

A handler that defines ``forward(inputs) -> outputs`` (batched torch tensors in and
out, the requests' rows concatenated along the first dimension) leaves the rest to
fnrt. Each instance has a :class:`Stager` with two slots (double buffering); a slot
holds the host buffers a batch is stacked into (page-locked on a GPU), the device
buffers they are copied to, and the host buffers the outputs come back into::

    host lane    stage k+1: stack ▸ copy H2D (copy stream) ▸ event "staged"
    instance     compute k: wait "staged" (compute stream) ▸ forward ▸ copy D2H ▸ event "done"

The compute stream waits on the copy stream's event, never the host; a slot is
staged again only after its last batch's "done". :meth:`Stager.stage` runs on the
instance's host lane (a thread of its own) and :meth:`Stager.compute` on the
instance's thread, so on the CPU, where both are plain memory, stacking batch k+1
overlaps computing batch k too (torch computes without the GIL).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fnrt.functions.dtypes import numpy_dtype
from fnrt.functions.errors import HandlerError, InvalidInput
from fnrt.functions.extras import require
from fnrt.functions.handler import Request
from fnrt.functions.manifest import TensorSpec
from fnrt.functions.tensors import coerce_result, to_numpy
from fnrt.loader.streams import Event, HostBuffer, Lanes

Forward = Callable[[dict[str, Any]], Mapping[str, Any]]

#: batches in flight per instance: one computing, one staged ahead
DEPTH = 2
#: the largest page-locked buffer an instance keeps per input or output; a batch
#: larger than that (a burst of the largest bodies the server admits) is staged in
#: ordinary memory, whose copy is not asynchronous, rather than lock that much RAM
MAX_PINNED_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class StageTimes:
    """Where one staged batch's time went, in seconds."""

    stack_s: float  # stacking the requests into the host buffers
    compute_s: float  # from launch to the outputs back on the host
    output_s: float  # splitting and checking the outputs


@dataclass
class _Slot:
    """One set of buffers a batch is staged in, reused once its last batch is done."""

    staged: Event
    done: Event
    host_in: dict[str, HostBuffer] = field(default_factory=dict)
    device_in: dict[str, Any] = field(default_factory=dict)  # uint8 torch tensors (GPU)
    host_out: dict[str, HostBuffer] = field(default_factory=dict)
    keep: list[Any] = field(default_factory=list)  # output tensors until their copy is done
    busy: bool = False


class Ahead(Protocol):
    """What stages an instance's batches ahead: a :class:`Stager` (a thread instance of
    a ``forward`` handler), or a worker process's second pair of arenas
    (``process.SentAhead``): either gives back a batch it staged that will not run."""

    def release(self, staged: Staged) -> None: ...


@dataclass
class Staged:
    """A batch staged ahead: stacked (and, on a GPU, on its way to the device) in one of a
    stager's slots, or (``sent``) written into a worker's second request arena and sent."""

    slot: _Slot | None
    rows: list[int]  # each request's rows
    inputs: dict[str, Any]  # torch tensors over the slot's buffers
    stack_s: float
    stager: Ahead
    sent: Any = None  # a worker's: the future of its reply
    #: a worker's first batch, sent during its load: when (``time.time_ns``), the start
    #: of its batch's span (the worker may run it before the batcher looks again)
    sent_ns: int = 0

    def release(self) -> None:
        """Give the slot back without computing the batch (its instance was lost)."""
        self.stager.release(self)


class Stager:
    """Stages batches for one instance's ``forward`` and runs it on the instance's streams."""

    def __init__(
        self,
        forward: Forward,
        inputs: Mapping[str, TensorSpec],
        outputs: Mapping[str, TensorSpec],
        lanes: Lanes,
        depth: int = DEPTH,
    ) -> None:
        self.torch = require("torch", "a handler with forward()")
        unbatched = [n for n, s in inputs.items() if not s.shape or s.shape[0] != -1]
        if unbatched or not inputs:  # checked at deploy too (check_staged_inputs)
            raise HandlerError(
                "a handler with forward() needs inputs whose first dimension is -1 "
                f"(rows, concatenated across requests); not so: {', '.join(unbatched) or 'none'}"
            )
        self.forward = forward
        self.input_specs = dict(inputs)
        self.output_specs = dict(outputs)
        self.lanes = lanes
        self.first = next(iter(inputs))
        self._slots = [_Slot(lanes.event(), lanes.event()) for _ in range(depth)]
        self._free = threading.Condition()
        self.host_lane = ThreadPoolExecutor(1, thread_name_prefix="fnrt-stage")

    # --- host lane ------------------------------------------------------------------

    def stage(self, batch: list[Request]) -> Staged:
        """Stack ``batch`` into a free slot and queue its copy to the device (host lane)."""
        start = time.perf_counter()
        rows = [len(request[self.first]) for request in batch]
        total = sum(rows)
        self.lanes.bind()  # this thread's CUDA device is the instance's (cuda:1, say)
        slot = self._take_slot()
        try:
            tensors = {
                name: self._stack(slot, name, batch, rows, total) for name in self.input_specs
            }
            slot.staged.record(self.lanes.copy)
        except BaseException:
            self._give_back(slot)
            raise
        return Staged(slot, rows, tensors, time.perf_counter() - start, self)

    def _stack(
        self, slot: _Slot, name: str, batch: list[Request], rows: list[int], total: int
    ) -> Any:
        dtype = numpy_dtype(self.input_specs[name].dtype)
        parts = [request[name] for request in batch]
        tail = parts[0].shape[1:]
        for i, (part, n) in enumerate(zip(parts, rows, strict=True)):
            if part.shape[:1] != (n,) or part.shape[1:] != tail:
                raise ValueError(
                    f"request {i}: input '{name}' has shape {list(part.shape)}; a handler with "
                    f"forward() needs {n} rows (as '{self.first}') of shape {list(tail)}"
                )
        shape = (total, *tail)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        host = _grown(slot.host_in, name, nbytes, self._host_buffer)
        stacked = host.view(dtype, shape)
        np.concatenate(parts, out=stacked) if len(parts) > 1 else np.copyto(stacked, parts[0])
        torch = self.torch
        if not self.lanes.on_gpu:
            return _as_torch(torch, stacked)
        device = _grown(slot.device_in, name, nbytes, self._device_buffer)
        self.lanes.to_device(device.data_ptr(), host, nbytes, self.lanes.copy)
        return device[:nbytes].view(_torch_dtype(torch, dtype)).view(shape)

    def _host_buffer(self, nbytes: int) -> HostBuffer:
        if nbytes > MAX_PINNED_BYTES:
            return HostBuffer(np.empty(nbytes, np.uint8))
        return self.lanes.host_buffer(nbytes)

    def _device_buffer(self, nbytes: int) -> Any:
        return self.torch.empty(
            max(nbytes, 1), dtype=self.torch.uint8, device=self.lanes.device.torch
        )

    # --- the instance's thread ----------------------------------------------------------

    def compute(self, staged: Staged) -> tuple[list[dict[str, np.ndarray[Any, Any]]], StageTimes]:
        """Run ``forward`` on a staged batch once its copy is in, bring the outputs back and
        split them per request (the instance's thread; the slot is free again after)."""
        slot = staged.slot
        assert slot is not None  # staged here
        lanes = self.lanes
        torch = self.torch
        try:
            start = time.perf_counter()
            lanes.compute.wait(slot.staged)
            with torch.inference_mode():
                if lanes.on_gpu:
                    with torch.cuda.stream(lanes.device_stream(torch)):
                        outputs = self._checked(self.forward(staged.inputs), sum(staged.rows))
                        arrays = self._to_host(slot, outputs)
                else:
                    outputs = self._checked(self.forward(staged.inputs), sum(staged.rows))
                    arrays = {n: self._own(slot, to_numpy(t)) for n, t in outputs.items()}
            slot.done.record(lanes.compute)
            slot.done.synchronize()
            computed = time.perf_counter()
            results = self._split(arrays, staged.rows, copy=lanes.on_gpu)
            times = StageTimes(staged.stack_s, computed - start, time.perf_counter() - computed)
        finally:
            self._give_back(slot)
        return results, times

    def run(self, batch: list[Request]) -> list[dict[str, np.ndarray[Any, Any]]]:
        """Stage and compute one batch on the calling thread (no overlap): what a worker
        process and an instance without a batch ahead do."""
        return self.compute(self.stage(batch))[0]

    def release(self, staged: Staged) -> None:
        """Give back the slot of a staged batch that will not be computed."""
        slot = staged.slot
        assert slot is not None  # staged here
        slot.staged.synchronize()
        self._give_back(slot)

    def _checked(self, outputs: Any, total: int) -> dict[str, Any]:
        if not isinstance(outputs, Mapping):
            raise ValueError(
                "forward() must return a mapping of output name to tensor, "
                f"got {type(outputs).__name__}"
            )
        if self.output_specs and set(outputs) != set(self.output_specs):
            raise ValueError(
                f"forward() outputs {sorted(outputs)} do not match the declared outputs "
                f"{sorted(self.output_specs)}"
            )
        checked: dict[str, Any] = {}
        for name, tensor in outputs.items():
            if not isinstance(tensor, self.torch.Tensor):
                tensor = self.torch.as_tensor(np.asarray(tensor))
            if tensor.dim() == 0 or tensor.shape[0] != total:
                raise ValueError(
                    f"forward() output '{name}' has shape {list(tensor.shape)}: its first "
                    f"dimension must be the batch's {total} rows"
                )
            checked[str(name)] = tensor.detach()
        return checked

    @staticmethod
    def _own(slot: _Slot, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """``array``, copied when it is a view of the slot's inputs (``forward`` returned an
        input, or a slice of one): the slot is staged again while the answer is encoded."""
        if any(np.may_share_memory(array, b.array) for b in slot.host_in.values()):
            return array.copy()
        return array

    def _to_host(self, slot: _Slot, outputs: dict[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
        """Queue each output's copy into the slot's host buffers, on the compute stream."""
        arrays: dict[str, np.ndarray[Any, Any]] = {}
        for name, tensor in outputs.items():
            tensor = tensor.contiguous()
            if tensor.device.type != "cuda":
                arrays[name] = tensor.numpy()
                continue
            dtype = _numpy_dtype(self.torch, tensor.dtype)
            nbytes = tensor.numel() * tensor.element_size()
            host = _grown(slot.host_out, name, nbytes, self._host_buffer)
            self.lanes.to_host(host, tensor.data_ptr(), nbytes, self.lanes.compute)
            arrays[name] = host.view(dtype, tuple(tensor.shape))
            slot.keep.append(tensor)  # alive until "done": the copy reads it
        return arrays

    def _split(
        self, arrays: dict[str, np.ndarray[Any, Any]], rows: list[int], *, copy: bool
    ) -> list[dict[str, np.ndarray[Any, Any]]]:
        cuts = np.cumsum(rows)[:-1]
        per_output = {
            name: np.split(array.copy() if copy else array, cuts) for name, array in arrays.items()
        }
        specs = self.output_specs
        return [
            coerce_result(specs, {name: parts[i] for name, parts in per_output.items()})
            for i in range(len(rows))
        ]

    # --- slots --------------------------------------------------------------------------

    def _take_slot(self) -> _Slot:
        with self._free:
            while True:
                for slot in self._slots:
                    if not slot.busy:
                        slot.busy = True
                        slot.keep.clear()
                        return slot
                self._free.wait()

    def _give_back(self, slot: _Slot) -> None:
        with self._free:
            slot.busy = False
            self._free.notify()

    def close(self) -> None:
        """Free the buffers and the host lane (after the work queued on the streams)."""
        self.host_lane.shutdown(wait=False)
        self.lanes.close()
        for slot in self._slots:
            for buffer in (*slot.host_in.values(), *slot.host_out.values()):
                buffer.close()
            slot.host_in.clear()
            slot.host_out.clear()
            slot.device_in.clear()
            slot.staged.close()
            slot.done.close()


def rows_disagree(request: Request) -> InvalidInput | None:
    """Why a request cannot join a staged batch: its inputs' first dimensions (rows)
    differ, so its outputs could not be split back out of the batch's (None: they agree).
    Checked as a request is admitted, so it is a 422 of its own, not its batch's failure."""
    rows = -1
    first = ""
    for name, array in request.items():
        n = array.shape[0] if array.ndim else -2
        if rows == -1:
            rows, first = n, name
        elif n != rows:
            return InvalidInput(
                f"input '{name}' has {n} rows and '{first}' {rows}: this function's handler "
                "(forward) needs every input of a request to have the same number of rows",
                input=name,
            )
    return None


def _grown(buffers: dict[str, Any], name: str, nbytes: int, make: Callable[[int], Any]) -> Any:
    """The buffer ``name``, made anew (at least twice as large) when ``nbytes`` do not fit."""
    buffer = buffers.get(name)
    size = buffer.nbytes if isinstance(buffer, HostBuffer) else _tensor_bytes(buffer)
    if buffer is None or size < nbytes:
        if isinstance(buffer, HostBuffer):
            buffer.close()
        buffer = buffers[name] = make(max(nbytes, 2 * size))
    return buffer


def _tensor_bytes(tensor: Any) -> int:
    return 0 if tensor is None else int(tensor.numel())


def _as_torch(torch: Any, array: np.ndarray[Any, Any]) -> Any:
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _torch_dtype(torch: Any, dtype: np.dtype[Any]) -> Any:
    if dtype.name == "bfloat16":
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype)).dtype


def _numpy_dtype(torch: Any, dtype: Any) -> np.dtype[Any]:
    if dtype == torch.bfloat16:
        return numpy_dtype("bfloat16")
    made: np.dtype[Any] = np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)
    return made
