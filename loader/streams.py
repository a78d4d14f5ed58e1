"""Streams, events and host buffers of one instance: the order of copies and compute.

An instance on a GPU owns two non-blocking CUDA streams, made here with
cuda-python: a copy stream for host-to-device transfers and a compute stream
the handler runs on (torch through ``torch.cuda.ExternalStream``, onnxruntime
through its CUDA provider's ``user_compute_stream``). Work crosses from one to
the other through events: the compute stream waits on the event recorded after
a batch's inputs were copied, and a staging buffer is written again only after
the event recorded after the batch that used it.

On the CPU the same interface is kept with ordinary memory: a host "stream" is
the thread that calls it, so work on it is done when the call returns and an
event is complete once recorded. The ordering the GPU gets from its streams the
CPU gets from the threads of :mod:`fnrt.loader.staging`, which hand batches
over in the same order.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fnrt.functions.errors import FnrtError
from fnrt.functions.handler import Device


class CudaError(FnrtError):
    """A CUDA runtime call failed (the call and the runtime's own name for the error)."""


def _cudart() -> Any:
    from cuda.bindings import runtime as cudart

    return cudart


def check(result: Any, call: str = "CUDA call") -> Any:
    """The values of a cuda-python call (a tuple led by its error code), or CudaError."""
    err, *values = result if isinstance(result, tuple) else (result,)
    cudart = _cudart()
    if err != cudart.cudaError_t.cudaSuccess:
        _, name = cudart.cudaGetErrorName(err)
        raise CudaError(f"{call} failed: {name.decode() if isinstance(name, bytes) else name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


class Event:
    """A point in a stream's work: recorded on one stream, waited on by another or the host."""

    def record(self, stream: Stream) -> None:
        """Mark the point after everything queued on ``stream`` so far."""

    def done(self) -> bool:
        """Whether everything before the point has run (never blocks)."""
        return True

    def synchronize(self) -> None:
        """Block this thread until the point is reached."""

    def close(self) -> None:
        """Give the event back."""


class Stream:
    """An ordered queue of device work. On the host: the calling thread, nothing queued."""

    handle: int = 0  # the cudaStream_t as an integer (0 on the host: there is none)

    def wait(self, event: Event) -> None:
        """Work queued on this stream after this call starts once ``event`` is reached."""

    def synchronize(self) -> None:
        """Block this thread until everything queued on this stream has run."""

    def close(self) -> None:
        """Give the stream back (after its work has run)."""


@dataclass
class HostBuffer:
    """Reusable host memory: page-locked on a GPU (so copies from it are asynchronous),
    ordinary on the CPU. ``array`` is a uint8 view of all of it."""

    array: np.ndarray[Any, np.dtype[np.uint8]]
    pinned: bool = False
    _free: Any = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    @property
    def pointer(self) -> int:
        return int(self.array.ctypes.data)

    def view(self, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        """The first bytes of the buffer as an array of ``dtype`` and ``shape``."""
        count = int(np.prod(shape)) * dtype.itemsize
        return self.array[:count].view(dtype).reshape(shape)

    def close(self) -> None:
        if self._free is not None:
            free, self._free = self._free, None
            self.array = np.empty(0, np.uint8)
            free()


class Lanes:
    """What one instance orders its work with: a copy stream, a compute stream, events and
    host buffers. This base class is the CPU's: everything is done when called."""

    device: Device = Device("cpu")
    copy: Stream
    compute: Stream

    def __init__(self) -> None:
        self.copy = Stream()
        self.compute = Stream()

    @property
    def on_gpu(self) -> bool:
        return False

    def event(self) -> Event:
        return Event()

    def device_stream(self, torch: Any) -> Any:
        """The compute stream as torch sees it (None on the CPU)."""
        return None

    def bind(self) -> None:
        """Make the instance's device the calling thread's current one (CUDA keeps the
        current device per thread: a host lane's thread starts on device 0)."""

    def host_buffer(self, nbytes: int) -> HostBuffer:
        return HostBuffer(np.empty(max(nbytes, 1), np.uint8))

    def to_device(self, dst_pointer: int, src: HostBuffer, nbytes: int, stream: Stream) -> None:
        """Copy the first ``nbytes`` of ``src`` to device memory at ``dst_pointer``."""
        ctypes.memmove(dst_pointer, src.pointer, nbytes)

    def to_host(self, dst: HostBuffer, src_pointer: int, nbytes: int, stream: Stream) -> None:
        """Copy ``nbytes`` of device memory at ``src_pointer`` into ``dst``."""
        ctypes.memmove(dst.pointer, src_pointer, nbytes)

    def close(self) -> None:
        """Give back the streams (their work is waited for first)."""


class CudaEvent(Event):
    def __init__(self) -> None:
        cudart = _cudart()
        self._cudart = cudart
        flags = cudart.cudaEventDisableTiming | cudart.cudaEventBlockingSync
        self.event = check(cudart.cudaEventCreateWithFlags(flags), "cudaEventCreateWithFlags")

    def record(self, stream: Stream) -> None:
        assert isinstance(stream, CudaStream)
        check(self._cudart.cudaEventRecord(self.event, stream.stream), "cudaEventRecord")

    def done(self) -> bool:
        (err,) = self._cudart.cudaEventQuery(self.event)
        if err == self._cudart.cudaError_t.cudaErrorNotReady:
            return False
        check((err,), "cudaEventQuery")
        return True

    def synchronize(self) -> None:
        check(self._cudart.cudaEventSynchronize(self.event), "cudaEventSynchronize")

    def close(self) -> None:
        if self.event is not None:
            self._cudart.cudaEventDestroy(self.event)
            self.event = None


class CudaStream(Stream):
    """A non-blocking stream of fnrt's own (never stream 0, which onnxruntime takes for
    "no stream", and which would serialise with every other stream of the process)."""

    def __init__(self) -> None:
        cudart = _cudart()
        self._cudart = cudart
        self.stream = check(
            cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking),
            "cudaStreamCreateWithFlags",
        )
        self.handle = int(self.stream)

    def wait(self, event: Event) -> None:
        assert isinstance(event, CudaEvent)
        check(self._cudart.cudaStreamWaitEvent(self.stream, event.event, 0), "cudaStreamWaitEvent")

    def synchronize(self) -> None:
        check(self._cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def close(self) -> None:
        if self.handle:
            self.synchronize()
            self._cudart.cudaStreamDestroy(self.stream)
            self.handle = 0


class CudaLanes(Lanes):
    """Streams and page-locked buffers on CUDA device ``device.index``."""

    def __init__(self, device: Device) -> None:
        cudart = _cudart()
        self._cudart = cudart
        self.device = device
        check(cudart.cudaSetDevice(device.index), "cudaSetDevice")
        self.copy = CudaStream()
        self.compute = CudaStream()
        self._torch_stream: Any = None
        self.idle = False  # closed, kept for the next instance

    @property
    def on_gpu(self) -> bool:
        return True

    def event(self) -> Event:
        return CudaEvent()

    def bind(self) -> None:
        check(self._cudart.cudaSetDevice(self.device.index), "cudaSetDevice")

    def device_stream(self, torch: Any) -> Any:
        if self._torch_stream is None:
            self._torch_stream = torch.cuda.ExternalStream(
                self.compute.handle, device=self.device.torch
            )
        return self._torch_stream

    def host_buffer(self, nbytes: int) -> HostBuffer:
        return pinned_buffer(max(nbytes, 1))

    def to_device(self, dst_pointer: int, src: HostBuffer, nbytes: int, stream: Stream) -> None:
        assert isinstance(stream, CudaStream)
        kind = self._cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        check(
            self._cudart.cudaMemcpyAsync(dst_pointer, src.pointer, nbytes, kind, stream.stream),
            "cudaMemcpyAsync (host to device)",
        )

    def to_host(self, dst: HostBuffer, src_pointer: int, nbytes: int, stream: Stream) -> None:
        assert isinstance(stream, CudaStream)
        kind = self._cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        check(
            self._cudart.cudaMemcpyAsync(dst.pointer, src_pointer, nbytes, kind, stream.stream),
            "cudaMemcpyAsync (device to host)",
        )

    def close(self) -> None:
        """Drain the streams and keep them for the next instance on this device: libraries
        keep state per stream they ran on (cuBLAS a workspace), which a new stream per
        instance would leave behind at every scale to zero."""
        with _idle_lock:
            if self.idle:
                return
            self.idle = True
        self.copy.synchronize()
        self.compute.synchronize()
        with _idle_lock:
            _idle.setdefault(self.device.index, []).append(self)

    def destroy(self) -> None:
        self.copy.close()
        self.compute.close()


_idle: dict[int, list[CudaLanes]] = {}
_idle_lock = threading.Lock()


def pinned_buffer(nbytes: int) -> HostBuffer:
    """``nbytes`` of page-locked host memory (``cudaMallocHost``), freed on close."""
    cudart = _cudart()
    pointer = check(cudart.cudaMallocHost(nbytes), f"cudaMallocHost({nbytes})")
    raw = (ctypes.c_uint8 * nbytes).from_address(pointer)
    freed = threading.Lock()

    def free() -> None:
        with freed:
            cudart.cudaFreeHost(pointer)

    return HostBuffer(np.ctypeslib.as_array(raw), pinned=True, _free=free)


def warm_libraries(device: Device) -> None:
    """Make at the load what a first batch on the instance's compute stream would make
    (cuBLAS's workspace for that stream, torch's first blocks), so that the memory the
    load measures holds it and the first batch does not wait for it. Nothing on the
    CPU or without torch."""
    torch = sys.modules.get("torch")
    if torch is None or device.kind != "cuda" or not device.stream:
        return
    with torch.inference_mode(), torch.cuda.stream(device.torch_stream):
        a = torch.ones((64, 64), device=device.torch)
        (a @ a).sum().item()


def lanes_for(device: Device) -> Lanes:
    """An instance's lanes: CUDA streams on a GPU (ones an earlier instance closed, when
    there are), the CPU's otherwise."""
    if device.kind != "cuda":
        return Lanes()
    with _idle_lock:
        idle = _idle.get(device.index)
        if idle:
            lanes = idle.pop()
            lanes.idle = False
            return lanes
    return CudaLanes(device)
