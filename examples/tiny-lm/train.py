"""Train the ``tiny-lm`` example on ``corpus.txt`` and write ``weights.safetensors``.

python examples/tiny-lm/train.py [--out PATH] [--steps N] [--seed N]

On a laptop's CPU this takes well under a minute: a character-level model of
about 250 thousand parameters learns the corpus's words and phrases.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def load_model_module() -> Any:
    """``model.py`` beside this file, as a module of its own name (another example's
    ``model`` may be imported already)."""
    spec = importlib.util.spec_from_file_location("fnrt_example_tiny_lm_model", HERE / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def train(out: Path, steps: int = 600, seed: int = 0, log: bool = False) -> Path:
    m = load_model_module()
    import torch
    import torch.nn.functional as F

    from fnrt.loader.formats.safetensors import save_arrays

    torch.manual_seed(seed)
    torch.set_num_threads(min(torch.get_num_threads(), 4))
    data = torch.tensor(m.encode((HERE / "corpus.txt").read_text()))
    net = m.TinyLM()
    optimiser = torch.optim.AdamW(net.parameters(), lr=3e-3)
    window, batch = m.CONTEXT, 16
    mask = m.causal_mask(window)
    positions = torch.arange(window).expand(batch, window)
    started = time.perf_counter()
    for step in range(steps):
        starts = torch.randint(0, len(data) - window - 1, (batch,))
        x = torch.stack([data[s : s + window] for s in starts])
        y = torch.stack([data[s + 1 : s + window + 1] for s in starts])
        logits, _ = net(x, positions, mask)
        loss = F.cross_entropy(logits.reshape(-1, len(m.VOCAB)), y.reshape(-1))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if log and step % 100 == 0:
            print(f"step {step}: loss {loss.item():.3f} ({time.perf_counter() - started:.1f}s)")
    net.eval()
    save_arrays({k: v.detach().numpy() for k, v in net.state_dict().items()}, out)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "weights.safetensors")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(train(args.out, args.steps, args.seed, log=True))
