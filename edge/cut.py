"""Cutting an ONNX model at its split points (server side; needs the ``onnx`` package).

A model with split points ``p1 .. pn`` has ``n + 2`` splits: split ``k`` runs
the *head* (inputs -> ``p_k``) on the device and the *tail* (``p_k`` ->
outputs) on the server; split 0 is all on the server (the head is empty, the
tail the whole model) and ``n + 1`` all on the device. The cut models are
written once per model digest, each to a temporary name then renamed, so a
half-written file is never used.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fnrt.functions.errors import ManifestError
from fnrt.functions.extras import require


@dataclass(frozen=True)
class Point:
    """One split point: the tensor that crosses the network, per row of a batch."""

    name: str
    dtype: str  # numpy name: "float32"
    row_shape: tuple[int, ...]  # the shape after the batch dimension

    @property
    def row_bytes(self) -> int:
        size = 1
        for dim in self.row_shape:
            size *= dim
        return size * np.dtype(self.dtype).itemsize

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "row_shape": list(self.row_shape),
            "row_bytes": self.row_bytes,
        }


class Cuts:
    """The heads and tails of one ONNX model, cut on first use into ``folder``.

    The constructor checks the points: each must be a tensor of the graph with
    a fixed shape after the batch dimension, and everything after it must
    depend on it alone (a skip connection across a point is refused).
    """

    def __init__(self, model_path: Path, points: tuple[str, ...], folder: Path) -> None:
        onnx = require("onnx", "cutting a model at its split points")

        self.model_path = model_path
        self.folder = folder
        self.points_names = points
        model = onnx.shape_inference.infer_shapes(onnx.load(str(model_path)))
        graph = model.graph
        initializers = {t.name for t in graph.initializer}
        self.inputs = tuple(i.name for i in graph.input if i.name not in initializers)
        self.outputs = tuple(o.name for o in graph.output)
        typed = {v.name: v for v in (*graph.value_info, *graph.input, *graph.output)}
        produced = [o for node in graph.node for o in node.output]
        found = []
        for name in points:
            if name not in produced:
                raise ManifestError("split.points", f"{name!r} is not a tensor of the model")
            found.append(_point(name, typed.get(name)))
        self.points = tuple(found)
        self._check_order(graph, produced)
        self.input_points = tuple(
            _point(name, typed.get(name), "split.model", "model input ") for name in self.inputs
        )

    @property
    def count(self) -> int:
        """How many splits there are (``len(points) + 2``)."""
        return len(self.points) + 2

    def _check_order(self, graph: Any, produced: list[str]) -> None:
        """Each point must separate the graph: the nodes after it read nothing from
        before it except the point itself (and weights)."""
        initializers = {t.name for t in graph.initializer}
        position = {name: i for i, name in enumerate(produced)}
        marks = [position[p.name] for p in self.points]
        if marks != sorted(marks):
            raise ManifestError("split.points", "must be listed from the input to the output")
        index = 0
        producer_step: dict[str, int] = {name: -1 for name in self.inputs}
        for node in graph.node:
            for out in node.output:
                producer_step[out] = index
                index += 1
        for k, mark in enumerate(marks):
            point = self.points[k].name
            for node in graph.node:
                if producer_step[node.output[0]] <= mark:
                    continue
                for name in node.input:
                    if not name or name in initializers or name == point:
                        continue
                    if producer_step.get(name, -1) <= mark:
                        raise ManifestError(
                            "split.points",
                            f"{point!r} does not cut the model: {node.name or node.op_type} "
                            f"after it reads {name!r} from before it",
                        )

    def head(self, k: int) -> Path:
        """The model the device runs for split ``k`` (1 .. n + 1)."""
        if not 1 <= k <= len(self.points) + 1:
            raise ValueError(f"split {k} has no head (1 to {len(self.points) + 1})")
        if k == len(self.points) + 1:
            return self.model_path
        return self._cut(f"head-{k}", list(self.inputs), [self.points[k - 1].name])

    def tail(self, k: int) -> Path:
        """The model the server runs for split ``k`` (0 .. n)."""
        if not 0 <= k <= len(self.points):
            raise ValueError(f"split {k} has no tail (0 to {len(self.points)})")
        if k == 0:
            return self.model_path
        return self._cut(f"tail-{k}", [self.points[k - 1].name], list(self.outputs))

    def sent(self, k: int) -> Point | None:
        """What crosses the network at split ``k``: the point, or None (k = 0 sends the
        inputs, k = n + 1 nothing)."""
        return self.points[k - 1] if 1 <= k <= len(self.points) else None

    def _cut(self, stem: str, inputs: list[str], outputs: list[str]) -> Path:
        path = self.folder / f"{stem}.onnx"
        if path.is_file():
            return path
        import onnx.utils

        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{stem}-", suffix=".onnx")
        os.close(fd)
        try:
            onnx.utils.extract_model(str(self.model_path), tmp, inputs, outputs)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def digest_of(path: Path) -> str:
    """The sha256 hex digest of a file."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _point(name: str, value_info: Any, field: str = "split.points", what: str = "") -> Point:
    """What crosses the network at a point (``field``: the manifest's field to blame;
    ``what``: how to name the tensor, a model input being none of the points)."""
    import onnx

    if value_info is None or not value_info.type.HasField("tensor_type"):
        raise ManifestError(field, f"{what}{name!r}: its type is unknown (run shape inference)")
    tensor = value_info.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
    if len(dims) < 1 or any(d < 1 for d in dims[1:]):
        raise ManifestError(
            field,
            f"{what}{name!r} must have a fixed shape after the batch dimension to split the "
            f"model, got {dims}",
        )
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
    return Point(name, dtype, tuple(dims[1:]))
