"""torch checkpoints, memory-mapped and loaded without running pickled code."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from fnrt.functions.errors import HandlerError
from fnrt.functions.extras import require

M = TypeVar("M")
#: One module built on ``meta`` at a time: :func:`_no_init` swaps functions of a module
#: that every thread shares.
_BUILDING = threading.Lock()


def state_dict(path: Path, device: str = "cpu", *, trust_pickle: bool = False) -> dict[str, Any]:
    """``torch.load(mmap=True, weights_only=True)``; tensors stay backed by the file.

    ``trust_pickle`` unpickles arbitrary objects; only for checkpoints you made.
    """
    torch = require("torch", "loading a torch checkpoint")

    loaded = torch.load(path, map_location=device, mmap=True, weights_only=not trust_pickle)
    if not isinstance(loaded, dict):
        return {"": loaded}
    return loaded


def mapped_module(build: Callable[[], M], weights: Mapping[str, Any], *, strict: bool = True) -> M:
    """``build()`` on the ``meta`` device, then ``weights`` assigned in place, in eval mode.

    Building on ``meta`` allocates nothing and initialises nothing (a module built
    normally fills every parameter with random numbers only to overwrite them; on
    ``meta``, ``torch.nn.init``'s functions are skipped too: ``nn.Embedding``'s
    ``normal_`` there imports ``torch._dynamo``, 1-4 s of the tiny-lm example's first
    cold start, measured), and
    ``load_state_dict(assign=True)`` makes the parameters the mapped tensors themselves:
    no copy. A parameter or buffer the weights do not give stays on ``meta`` and is
    refused by name (with ``strict=False``, a missing key is no error by itself; a
    non-persistent buffer must be set again after).
    """
    torch = require("torch", "building a torch module")

    with _BUILDING, _no_init(torch), torch.device("meta"):
        made = build()
    made.load_state_dict(weights, strict=strict, assign=True)  # type: ignore[attr-defined]
    named = [*made.named_parameters(), *made.named_buffers()]  # type: ignore[attr-defined]
    empty = [name for name, tensor in named if tensor.is_meta]
    if empty:
        raise HandlerError(f"the weights do not give {', '.join(empty[:5])}; they stay empty")
    made.eval()  # type: ignore[attr-defined]
    return made


@contextlib.contextmanager
def _no_init(torch: Any) -> Iterator[None]:
    """``torch.nn.init``'s in-place initialisers made no-ops meanwhile (what
    ``transformers``' ``no_init_weights`` does): on ``meta`` they compute nothing, and
    some reach torch's reference implementations, which import ``torch._dynamo``."""
    init = torch.nn.init
    names = [n for n in dir(init) if n.endswith("_") and not n.startswith("_")]
    kept = {n: getattr(init, n) for n in names}
    for name in names:
        setattr(init, name, _unchanged)
    try:
        yield
    finally:
        for name, fn in kept.items():
            setattr(init, name, fn)


def _unchanged(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    return tensor
