"""The handler contract: what user code provides and what fnrt calls.

A handler is a class::

    class Model:
        def load(self, artifacts, device):      # once per instance
            self.net = build(artifacts["weights"].tensors(device))

        def __call__(self, batch):              # list of requests -> list of results
            return [{"y": self.net(r["x"])} for r in batch]

        def unload(self):                       # optional, when scaled to zero
            ...

or a plain function ``def handle(batch) -> list`` for handlers with no state,
or a per-request function wrapped by :func:`per_request`. ``__call__``,
``handle``, ``load`` and ``unload`` may be ``async def``: they run on an event
loop of the instance's own, never on the server's. Python generators are
refused: a handler that streams is a generative handler
(:mod:`fnrt.functions.generation`). A request is a mapping
of input name to a read-only numpy array; a result is a mapping of output name
to an array-like (numpy array, torch tensor, list). The handler returns exactly
one result per request, in order.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fnrt.functions.contract import check_constructible
from fnrt.functions.errors import HandlerError
from fnrt.functions.extras import install_hint
from fnrt.functions.generation import check_generator
from fnrt.functions.manifest import Manifest
from fnrt.functions.resources import Artifact as Artifact
from fnrt.functions.resources import Device as Device
from fnrt.functions.resources import Request as Request
from fnrt.functions.resources import Result as Result

if TYPE_CHECKING:
    pass

BatchFn = Callable[[list[Request]], Sequence[Result]]


class Handler:
    """Optional base class: subclass it and override ``load`` and ``__call__``."""

    def load(self, artifacts: Mapping[str, Artifact], device: Device) -> None:
        """Called once per instance, off the event loop, before any batch."""

    def __call__(self, batch: list[Request]) -> Sequence[Result]:
        raise NotImplementedError("a handler must implement __call__(batch)")

    def unload(self) -> None:
        """Called when the instance is scaled to zero; release what ``load`` took."""


def per_request(fn: Callable[[Request], Result]) -> BatchFn:
    """Turn a function of one request into a batch handler.

    Use it when the model gains nothing from batching::

        @per_request
        def handle(request):
            return {"y": request["x"] * 2}
    """

    def batch_fn(batch: list[Request]) -> list[Result]:
        return [fn(request) for request in batch]

    batch_fn.__name__ = getattr(fn, "__name__", "handler")
    batch_fn.__doc__ = fn.__doc__
    return batch_fn


def defines_forward(cls: type) -> bool:
    """Whether a handler class stages its batches through fnrt: it defines
    ``forward(inputs)``, which takes the batch's inputs stacked into tensors (each
    request's rows concatenated along the first dimension, on the instance's device)
    and returns its outputs the same way. fnrt then stacks, copies and splits, and
    overlaps staging the next batch with computing this one (docs/gpu.md)."""
    return any("forward" in vars(base) for base in cls.__mro__[:-1])


def _defines_call(cls: type) -> bool:
    return any("__call__" in vars(base) for base in cls.__mro__[:-1])


def _refuse_generator(fn: object, where: str) -> None:
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise HandlerError(
            f"{where} is a Python generator: return (or, in an async handler, return "
            "from the coroutine) one result per request; to stream results, write a "
            "generative handler (start/step, with a [generation] section: docs/generation.md)"
        )


def check_contract(obj: object, where: str) -> None:
    """Raise HandlerError unless ``obj`` is a handler class or batch function."""
    if inspect.isclass(obj):
        staged = defines_forward(obj)
        if not staged and (not _defines_call(obj) or obj.__call__ is Handler.__call__):
            raise HandlerError(
                f"handler class {where} must define __call__(self, batch) or forward(self, inputs)"
            )
        method = "forward" if staged else "__call__"
        _refuse_generator(getattr(obj, method), f"{where}.{method}")
        check_constructible(obj, where)
        try:
            inspect.signature(getattr(obj, method)).bind(None, {} if staged else [])
        except TypeError:
            what = "the batched inputs" if staged else "the batch"
            raise HandlerError(f"{where}.{method} must take one argument: {what}") from None
        if staged and inspect.iscoroutinefunction(getattr(obj, method)):
            raise HandlerError(f"{where}.forward must be a plain function, not async")
        load = getattr(obj, "load", None)
        if load is not None:
            try:
                inspect.signature(load).bind(None, {}, None)
            except TypeError:
                raise HandlerError(f"{where}.load must take (self, artifacts, device)") from None
        return
    if callable(obj):
        _refuse_generator(obj, where)
        try:
            inspect.signature(obj).bind([])
        except (TypeError, ValueError):
            raise HandlerError(
                f"handler function {where} must take one argument: the batch"
            ) from None
        return
    raise HandlerError(f"{where} is a {type(obj).__name__}, not a handler class or function")


def bundle_package(code_digest: str) -> str:
    """The import package a code bundle is imported under (one per content)."""
    return f"fnrt_bundle_{code_digest[:16]}"


def import_handler(code_dir: Path, manifest: Manifest, package: str) -> object:
    """Import the manifest's handler from an unpacked bundle and check its contract.

    The bundle is imported as package ``package`` so two functions whose files
    share a name (``handler.py``) never collide; sibling modules are reached by
    relative imports (``from .model import Net``).
    """
    if package not in sys.modules:
        spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
        pkg = importlib.util.module_from_spec(spec)
        pkg.__path__ = [str(code_dir)]
        sys.modules[package] = pkg
    qualified = f"{package}.{manifest.module}"
    try:
        module = importlib.import_module(qualified)
    except Exception as exc:
        sys.modules.pop(qualified, None)
        hint = install_hint(exc) if isinstance(exc, ImportError) else ""
        raise HandlerError(
            f"cannot import handler module '{manifest.module}': {type(exc).__name__}: {exc}{hint}"
        ) from exc
    if not hasattr(module, manifest.attribute):
        raise HandlerError(
            f"handler module '{manifest.module}' has no attribute '{manifest.attribute}'"
        )
    obj = getattr(module, manifest.attribute)
    if manifest.generative:
        check_generator(obj, manifest.handler)
    else:
        check_contract(obj, manifest.handler)
        if inspect.isclass(obj) and defines_forward(obj):
            check_staged_inputs(manifest, manifest.handler)
    return obj


def check_staged_inputs(manifest: Manifest, where: str) -> None:
    """HandlerError unless every input of a ``forward`` handler has rows (a first
    dimension of -1) to concatenate the batch's requests along."""
    fixed = [n for n, s in manifest.inputs.items() if not s.shape or s.shape[0] != -1]
    if fixed or not manifest.inputs:
        raise HandlerError(
            f"{where} defines forward(inputs), which needs [inputs] whose first dimension "
            f"is -1 (rows, concatenated across requests); not so: {', '.join(fixed) or 'none'}"
        )
