"""The CPU's lanes: the same interface as CUDA's, with work done when called."""

from __future__ import annotations

import numpy as np

from fnrt.functions.handler import Device
from fnrt.loader.streams import HostBuffer, Lanes, lanes_for


def test_cpu_lanes_copy_at_once_and_their_events_are_always_reached() -> None:
    lanes = lanes_for(Device("cpu"))
    assert type(lanes) is Lanes and not lanes.on_gpu
    assert lanes.copy.handle == lanes.compute.handle == 0  # no stream: the calling thread
    assert lanes.device_stream(None) is None
    src = lanes.host_buffer(64)
    src.array[:] = np.arange(64, dtype=np.uint8)
    device = np.zeros(64, np.uint8)
    lanes.to_device(device.ctypes.data, src, 64, lanes.copy)
    event = lanes.event()
    event.record(lanes.copy)
    assert event.done()
    lanes.compute.wait(event)
    back = lanes.host_buffer(64)
    lanes.to_host(back, device.ctypes.data, 64, lanes.compute)
    np.testing.assert_array_equal(back.array, np.arange(64, dtype=np.uint8))
    lanes.close()


def test_a_host_buffer_views_its_first_bytes_as_any_dtype() -> None:
    buffer = HostBuffer(np.zeros(64, np.uint8))
    view = buffer.view(np.dtype(np.float32), (3, 4))
    view[:] = 1.5
    assert buffer.nbytes == 64 and not buffer.pinned
    assert np.frombuffer(buffer.array[:48].tobytes(), np.float32).tolist() == [1.5] * 12
    assert buffer.array[48:].sum() == 0
    buffer.close()  # an ordinary buffer: nothing to free


def test_the_device_gives_handlers_no_stream_on_the_cpu() -> None:
    device = Device("cpu")
    assert device.stream == 0 and device.torch_stream is None
    assert device.onnx_providers == ["CPUExecutionProvider"]


def test_a_cuda_device_hands_its_stream_to_onnxruntime() -> None:
    device = Device("cuda", 1, stream=1234)
    provider, options = device.onnx_providers[0]
    assert provider == "CUDAExecutionProvider"
    assert options == {
        "device_id": 1,
        "has_user_compute_stream": "1",
        "user_compute_stream": "1234",
    }
    assert Device("cuda", 0).onnx_providers[0][1] == {"device_id": 0}  # no stream: none asked
