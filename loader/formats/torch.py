"""torch checkpoints, memory-mapped and loaded without running pickled code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fnrt.functions.extras import require


def state_dict(path: Path, device: str = "cpu", *, trust_pickle: bool = False) -> dict[str, Any]:
    """``torch.load(mmap=True, weights_only=True)``; tensors stay backed by the file.

    ``trust_pickle`` unpickles arbitrary objects; only for checkpoints you made.
    """
    torch = require("torch", "loading a torch checkpoint")

    loaded = torch.load(path, map_location=device, mmap=True, weights_only=not trust_pickle)
    if not isinstance(loaded, dict):
        return {"": loaded}
    return loaded
