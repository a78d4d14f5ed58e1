"""Build the ``cnn-split`` network (seeded weights), export it to ``model.onnx``
with its layer boundaries named, and write ``sample.json``.

    python examples/cnn-split/export.py [--out FOLDER]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def export(out: Path) -> list[str]:
    import torch

    from fnrt.edge.export import export_sequential

    sys.path.insert(0, str(HERE))
    try:
        from model import IMAGE_SHAPE, build
    finally:
        sys.path.remove(str(HERE))
    torch.manual_seed(0)
    model = build()
    points = export_sequential(model, torch.zeros(1, *IMAGE_SHAPE), out / "model.onnx")
    image = torch.rand(1, *IMAGE_SHAPE, generator=torch.Generator().manual_seed(1))
    sample = {"x": [[[[round(v, 3) for v in row] for row in c] for c in image[0].tolist()]]}
    (out / "sample.json").write_text(json.dumps(sample))
    return points


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    print("layer boundaries:", ", ".join(export(args.out)))
