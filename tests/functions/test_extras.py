"""A missing optional dependency is one line that names the extra to install."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fnrt.functions.errors import HandlerError
from fnrt.functions.extras import (
    EXTRA_OF,
    MissingExtra,
    install_command,
    install_hint,
    require,
)
from fnrt.functions.handler import import_handler
from fnrt.functions.manifest import load_manifest
from fnrt.runtime.cli.main import main
from support import write_function


def _hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``import module`` fail as it does where the package is not installed."""
    for name in list(sys.modules):
        if name.split(".")[0] in modules:
            monkeypatch.delitem(sys.modules, name)
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


@pytest.mark.parametrize(
    ("module", "purpose", "extra"),
    [
        ("boto3", "an s3:// store", "s3"),
        ("onnxruntime", "loading an .onnx artifact", "onnx"),
        ("torch", "loading a torch checkpoint", "torch"),
        ("redis.asyncio", "the shared result cache (--redis-url)", "redis"),
        ("matplotlib.pyplot", "--plot", "plot"),
    ],
)
def test_require_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, purpose: str, extra: str
) -> None:
    top = module.split(".")[0]
    _hide(monkeypatch, top)
    with pytest.raises(MissingExtra) as info:
        require(module, purpose)
    assert str(info.value) == (
        f"{purpose} needs {top}, which is not installed: {install_command(extra)}"
    )
    assert info.value.fields == {"module": top, "extra": extra}


def test_the_edge_device_is_told_the_slim_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, "onnxruntime")
    with pytest.raises(MissingExtra, match=r"\[edge\]'$"):
        require("onnxruntime", "running a model's head on this device", extra="edge")


def test_a_broken_package_is_not_mistaken_for_a_missing_one(tmp_path: Path) -> None:
    (tmp_path / "fnrt_broken_pkg.py").write_text("import fnrt_no_such_dependency\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ModuleNotFoundError, match="fnrt_no_such_dependency"):
            require("fnrt_broken_pkg", "a test")
    finally:
        sys.path.remove(str(tmp_path))
    assert set(EXTRA_OF.values()) <= {"torch", "onnx", "gpu", "s3", "redis", "plot", "otel"}


def test_a_handler_importing_a_missing_framework_is_told_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_function(
        tmp_path, "tnet", "import torch\n\ndef handle(batch):\n    return batch\n"
    )
    (folder / "fnrt.toml").write_text(
        (folder / "fnrt.toml").read_text().replace("handler:Echo", "handler:handle")
    )
    _hide(monkeypatch, "torch")
    with pytest.raises(HandlerError) as info:
        import_handler(folder, load_manifest(folder), "fnrt_extras_test")
    assert str(info.value).endswith(f"; {install_command('torch')}"), str(info.value)
    assert install_hint(ModuleNotFoundError("x", name="numpy")) == ""


def test_the_cli_says_one_line_before_any_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _hide(monkeypatch, "matplotlib")
    code = main(["simulate", "--synthetic", "20", "--plot", str(tmp_path / "p.png")])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err == (
        f"fnrt: --plot needs matplotlib, which is not installed: {install_command('plot')}\n"
    )
    _hide(monkeypatch, "boto3", "botocore")
    store = ("--store", "s3://bucket/fnrt")
    code = main(["deploy", str(write_function(tmp_path, "echo")), *store])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and install_command("s3") in err, err


def test_the_hint_names_the_checkout_this_fnrt_was_installed_from() -> None:
    # the suite runs on `make test`'s editable install of this checkout (`pip install -e`);
    # fnrt is on no public index, so `pip install 'fnrt[plot]'` would install nothing of ours
    root = Path(__file__).resolve().parents[2]
    assert install_command("plot") == f"{sys.executable} -m pip install -e '{root}[plot]'"


def test_the_hint_names_this_interpreters_pip_not_a_bare_pip() -> None:
    # a bare `pip`, outside an activated virtualenv, is another Python's: the hint runs
    # this interpreter's pip, so the extra lands next to the fnrt that asked for it
    command = install_command("s3")
    assert command.startswith(f"{sys.executable} -m pip install "), command
    assert not command.startswith("pip "), command
