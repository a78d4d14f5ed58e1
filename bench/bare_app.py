"""The baseline for the serving benchmarks: a bare Starlette endpoint calling the model.

What a user writes by hand without fnrt: parse the body, run the model inline,
answer. No queue, no batching, no thread hop, no validation. Run as
``python bench/bare_app.py EXAMPLE_DIR WEIGHTS PORT``; EXAMPLE_DIR's
``model.py`` has ``build()``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import msgpack
import msgpack_numpy
import numpy as np
import torch
from raw_app import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fnrt.loader.formats.safetensors import tensors


def model_runner(example: Path, weights: Path) -> Callable[[np.ndarray], np.ndarray]:
    """EXAMPLE_DIR's model with WEIGHTS, as a function of one batch (also ``lean_app.py``'s)."""
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    sys.path.insert(0, str(example))
    from model import build as build_model

    model = build_model().eval()
    model.load_state_dict(tensors(weights))

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            y: np.ndarray = model(torch.from_numpy(x)).numpy()
        return y

    return run


def build(example: Path, weights: Path) -> Starlette:
    run = model_runner(example, weights)

    async def invoke(request: Request) -> Response:
        if request.headers.get("content-type") == "application/msgpack":
            data = msgpack.unpackb(await request.body(), object_hook=msgpack_numpy.decode)
            y = run(np.asarray(data["x"], dtype=np.float32))
            body = msgpack.packb({"y": y}, default=msgpack_numpy.encode)
            return Response(body, media_type="application/msgpack")
        data = await request.json()
        y = run(np.asarray(data["x"], dtype=np.float32))
        return JSONResponse({"y": y.tolist()})

    return Starlette(routes=[Route("/invoke", invoke, methods=["POST"])])


if __name__ == "__main__":
    app = build(Path(sys.argv[1]), Path(sys.argv[2]))
    serve(app, int(sys.argv[3]))
