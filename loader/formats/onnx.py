"""ONNX models opened by onnxruntime straight from the cached file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fnrt.functions.extras import require


def session(path: Path, providers: list[Any], **options: Any) -> Any:
    """An ``onnxruntime.InferenceSession`` for ``path`` (a file, or a folder with one .onnx).

    ``options`` set ``SessionOptions`` attributes, e.g. ``intra_op_num_threads=2``.
    External data files are found next to the model file.
    """
    ort = require("onnxruntime", "loading an .onnx artifact")

    if path.is_dir():
        models = sorted(path.glob("*.onnx"))
        if len(models) != 1:
            raise ValueError(f"{path} must hold exactly one .onnx file, found {len(models)}")
        path = models[0]
    available = set(ort.get_available_providers())  # onnxruntime without CUDA: the CPU
    providers = [p for p in providers if (p[0] if isinstance(p, tuple) else p) in available]
    so = ort.SessionOptions()
    for key, value in options.items():
        setattr(so, key, value)
    return ort.InferenceSession(str(path), sess_options=so, providers=providers)
