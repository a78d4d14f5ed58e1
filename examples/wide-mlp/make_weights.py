"""Write the ``wide-mlp`` example's weights to ``weights.safetensors`` beside this file.

python examples/wide-mlp/make_weights.py [--out PATH] [--seed N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def make_weights(out: Path, seed: int = 0) -> Path:
    sys.path.insert(0, str(HERE))
    try:
        from model import seeded
    finally:
        sys.path.remove(str(HERE))
    from fnrt.loader.formats.safetensors import save_arrays

    save_arrays({k: v.detach().numpy() for k, v in seeded(seed).state_dict().items()}, out)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "weights.safetensors")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(make_weights(args.out, args.seed))
