"""Optional dependencies: which extra of ``fnrt`` installs a module, and one clear error.

The base install serves, deploys and calls numpy handlers. Frameworks, stores
and tools come as extras (``pip install 'fnrt[torch,onnx,s3]'``); code that
needs one imports it through :func:`require`, so a missing one is a line that
names the extra, never a traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from fnrt.functions.errors import FnrtError

#: Top-level module -> the extra that installs it.
EXTRA_OF = {
    "torch": "torch",
    "onnxruntime": "onnx",
    "onnx": "onnx",
    "boto3": "s3",
    "botocore": "s3",
    "redis": "redis",
    "matplotlib": "plot",
    "cuda": "gpu",
    "pynvml": "gpu",
    "opentelemetry": "otel",
}


class MissingExtra(FnrtError):
    """An optional dependency is not installed; the message says which extra has it."""

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs {module}, which is not installed: pip install 'fnrt[{extra}]'",
            module=module,
            extra=extra,
        )
        self.module = module
        self.extra = extra


def require(module: str, purpose: str, extra: str | None = None) -> ModuleType:
    """Import ``module`` (dotted names too), or raise MissingExtra naming its extra
    (``extra``, else the one that installs it).

    ``purpose`` says what wanted it ("loading an .onnx artifact"). An ImportError
    from inside an installed package (a broken install) is raised as it is.
    """
    top = module.split(".", 1)[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".", 1)[0] != top:
            raise
        raise MissingExtra(top, extra or EXTRA_OF.get(top, top), purpose) from None


def install_hint(error: ImportError) -> str:
    """``; pip install 'fnrt[torch]'`` when ``error`` is a module an extra provides, else ''."""
    name = (error.name or "").split(".", 1)[0]
    extra = EXTRA_OF.get(name)
    return f"; pip install 'fnrt[{extra}]'" if extra else ""
