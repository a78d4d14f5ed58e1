"""Optional dependencies: which extra of ``fnrt`` installs a module, and one clear error.

The base install serves, deploys and calls numpy handlers. Frameworks, stores
and tools come as extras (``pip install '.[torch,onnx,s3]'`` from a checkout);
code that needs one imports it through :func:`require`, so a missing one is a
line that names the extra and a pip command that installs it the way this fnrt
was installed (fnrt is not on a public package index), never a traceback.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import json
import shlex
import sys
from types import ModuleType
from urllib.parse import unquote, urlparse

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
            f"{purpose} needs {module}, which is not installed: {install_command(extra)}",
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


def install_command(extra: str) -> str:
    """The pip command that adds ``extra`` to this fnrt, as it was installed.

    It names this interpreter's pip (``<sys.executable> -m pip``): a bare ``pip``,
    outside an activated virtualenv, is another Python's and would install there.

    pip records where a package came from in ``direct_url.json``: a checkout
    (``-e`` when editable) or a wheel file is named by its path, with the extra;
    an install pip did not record a source for is told the checkout's form.
    """
    source = install_source()
    pip = f"{shlex.quote(sys.executable)} -m pip install"
    if source is None:
        return f"{pip} '<fnrt checkout or wheel>[{extra}]'"
    path, editable = source
    return f"{pip} {'-e ' if editable else ''}'{path}[{extra}]'"


@functools.cache
def install_source() -> tuple[str, bool] | None:
    """(local path, editable) this fnrt was installed from, from pip's
    ``direct_url.json``; None when pip recorded none (or no local file)."""
    # the first fnrt that pip installed (a checkout's own fnrt.egg-info, left by a
    # build, may come first on the path and records no source)
    recorded = next(
        (
            text
            for dist in importlib.metadata.distributions(name="fnrt")
            if (text := dist.read_text("direct_url.json"))
        ),
        None,
    )
    if recorded is None:
        return None
    try:
        info = json.loads(recorded)
    except ValueError:
        return None
    url = urlparse(str(info.get("url", "")))
    if url.scheme != "file":
        return None
    editable = bool(info.get("dir_info", {}).get("editable", False))
    return unquote(url.path), editable


def install_hint(error: ImportError) -> str:
    """``; <python> -m pip install '<source>[torch]'`` when ``error`` is a module an extra
    provides, else ''."""
    name = (error.name or "").split(".", 1)[0]
    extra = EXTRA_OF.get(name)
    return f"; {install_command(extra)}" if extra else ""
