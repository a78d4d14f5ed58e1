"""What a handler is given and returns: requests, results, its device, its artifacts.

Shared by the batch contract (``handler.py``) and the generative one
(``generation.py``); handlers import these from ``fnrt.functions``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

Request = Mapping[str, "np.ndarray[Any, Any]"]
Result = Mapping[str, Any]
M = TypeVar("M")  # what Artifact.module builds: a torch module


@dataclass(frozen=True)
class Device:
    """Where an instance runs. Chosen once per process by ``fnrt.loader.device``."""

    kind: Literal["cpu", "cuda"] = "cpu"
    index: int = 0
    #: the instance's own compute stream (a ``cudaStream_t`` as an integer; 0: none, the CPU)
    stream: int = 0

    @property
    def torch(self) -> str:
        """The torch device string: ``"cpu"`` or ``"cuda:N"``."""
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    @property
    def torch_stream(self) -> Any:
        """The instance's compute stream as a ``torch.cuda.ExternalStream`` (None on the
        CPU). fnrt already runs ``__call__`` and ``forward`` on it; a thread of the
        handler's own enters it with ``torch.cuda.stream(device.torch_stream)``."""
        if self.kind != "cuda" or not self.stream:
            return None
        import torch

        external: Any = torch.cuda.ExternalStream
        return external(self.stream, device=self.torch)

    @property
    def onnx_providers(self) -> list[Any]:
        """onnxruntime providers this device has (never ones that would fail to load); on a
        GPU the CUDA provider runs on the instance's compute stream (``user_compute_stream``)."""
        if self.kind == "cuda":
            options: dict[str, Any] = {"device_id": self.index}
            if self.stream:
                options |= {"has_user_compute_stream": "1", "user_compute_stream": str(self.stream)}
            return [("CUDAExecutionProvider", options), "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def __str__(self) -> str:
        return self.torch


@runtime_checkable
class Artifact(Protocol):
    """A deployed artifact as the handler's ``load`` sees it, already on local disk.

    ``path`` is a file (or a folder, for folder artifacts) that may be opened
    directly; the helpers map weights from it without reading them into a
    private buffer.
    """

    name: str
    path: Path
    digest: str
    size_bytes: int

    def tensors(self, device: Device | str = "cpu") -> dict[str, Any]:
        """A safetensors file as ``torch`` tensors backed by the mapped file."""
        ...

    def arrays(self) -> dict[str, np.ndarray[Any, Any]]:
        """A safetensors file as read-only numpy arrays backed by the mapped file."""
        ...

    def state_dict(self, device: Device | str = "cpu") -> dict[str, Any]:
        """A torch checkpoint via ``torch.load(mmap=True, weights_only=True)``."""
        ...

    def onnx_session(self, device: Device | None = None, **options: Any) -> Any:
        """An ``onnxruntime.InferenceSession`` opened from the cached path."""
        ...

    def module(
        self, build: Callable[[], M], device: Device | str | None = None, *, strict: bool = True
    ) -> M:
        """``build()`` on torch's ``meta`` device (no allocation, no random init) with the
        artifact's weights (safetensors or a torch checkpoint) assigned in place: mapped
        from the file, not copied. A parameter the weights do not give is refused."""
        ...
