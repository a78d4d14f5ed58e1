"""Exporting a torch ``nn.Sequential`` to ONNX with its layer boundaries named.

Needs torch and onnx (a development machine, not the device)::

    points = export_sequential(model, torch.zeros(1, 3, 32, 32), Path("model.onnx"))
    # ["after.0", "after.1", ...]: list the ones to cut at in fnrt.toml's [split] points

Each boundary tensor is renamed ``after.<i>`` (the output of layer ``i``), so
the manifest names split points by layer rather than by the exporter's
internal tensor names. A layer that exports to no node (``Dropout`` in eval
mode) has no boundary of its own.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any


def export_sequential(
    model: Any,
    example: Any,
    path: Path,
    *,
    input_name: str = "x",
    output_name: str = "y",
    opset: int = 17,
) -> list[str]:
    """Export ``model`` (an ``nn.Sequential``) to ``path``; the boundary names, in order."""
    import onnx
    import torch

    model = model.eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (example,),
            str(path),
            dynamo=False,
            opset_version=opset,
            input_names=[input_name],
            output_names=[output_name],
            dynamic_axes={input_name: {0: "n"}, output_name: {0: "n"}},
        )
    proto = onnx.load(str(path))
    graph = proto.graph
    last_output: dict[int, str] = {}
    for node in graph.node:
        layer = node.name.split("/")[1] if node.name.startswith("/") else ""
        if layer.isdigit():
            last_output[int(layer)] = node.output[0]
    renames = {
        tensor: f"after.{layer}"
        for layer, tensor in sorted(last_output.items())
        if tensor != output_name
    }
    for node in graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    for info in graph.value_info:
        info.name = renames.get(info.name, info.name)
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))
    return list(renames.values())
