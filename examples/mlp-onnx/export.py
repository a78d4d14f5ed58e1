"""Export the ``mlp`` example's network (same weights) to ``mlp.onnx`` beside this file.

    python examples/mlp-onnx/export.py [--weights PATH] [--out PATH]

Makes ``examples/mlp/weights.safetensors`` first if it is missing.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
MLP_DIR = HERE.parent / "mlp"


def export(weights: Path, out: Path) -> Path:
    import torch

    sys.path.insert(0, str(MLP_DIR))
    try:
        from make_weights import make_weights
        from model import IN_FEATURES, MLP
    finally:
        sys.path.remove(str(MLP_DIR))
    from fnrt.loader.formats.safetensors import tensors

    if not weights.exists():
        make_weights(weights)
    model = MLP().eval()
    model.load_state_dict(tensors(weights))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            (torch.zeros(1, IN_FEATURES),),
            str(out),
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "n"}, "y": {0: "n"}},
        )
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", type=Path, default=MLP_DIR / "weights.safetensors")
    parser.add_argument("--out", type=Path, default=HERE / "mlp.onnx")
    args = parser.parse_args()
    print(export(args.weights, args.out))
