"""Reading which installed packages a function's code imports, without running it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fnrt.loader import imports
from fnrt.loader.imports import code_imports, imported_names, installed

HANDLER = """
import os, json
import numpy as np
from idna import encode
from . import helper
from .helper import K
import fnrt.functions
import not_a_package_anywhere_here

class H:
    def load(self, artifacts, device):
        import msgpack  # a framework imported in load counts too
        self.k = K

    def __call__(self, batch):
        return batch
"""


def _code(tmp_path: Path, handler: str = HANDLER, **files: str) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "handler.py").write_text(handler)
    (code / "helper.py").write_text("K = 1\n")
    for name, text in files.items():
        path = code / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return code


def test_the_packages_a_handler_imports_anywhere_are_found(tmp_path: Path) -> None:
    found = code_imports(_code(tmp_path), "handler")
    # not the standard library, fnrt or a relative import; whether each is installed
    # is for each node to say (a deploy may run on another machine)
    assert found == ("idna", "msgpack", "not_a_package_anywhere_here", "numpy")


def test_a_name_the_code_provides_itself_is_never_imported_ahead(tmp_path: Path) -> None:
    # its own "numpy.py" and "msgpack/" shadow the installed ones for this code
    own = {"numpy.py": "X = 1\n", "msgpack/__init__.py": "", "lib/deep.py": "import idna\n"}
    found = code_imports(_code(tmp_path, **own), "handler")
    assert found == ("idna", "not_a_package_anywhere_here")


def test_code_that_does_not_parse_gives_no_names_and_no_error(tmp_path: Path) -> None:
    broken = "import idna\ndef f(:\n"
    assert imported_names(broken) == set()
    assert imported_names("import idna\x00") == set()  # a null byte: ValueError in ast
    assert code_imports(_code(tmp_path, broken, **{"other.py": "import numpy\n"}), "handler") == (
        "numpy",
    )


def test_only_so_much_source_is_read_and_the_handler_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = _code(tmp_path, "import idna\n", **{"a_vendored.py": "import numpy\n" + "#" * 100})
    monkeypatch.setattr(imports, "MAX_SCAN_BYTES", 50)
    assert code_imports(code, "handler") == ("idna",)  # the handler, read before the rest


def test_installed_means_found_in_site_packages() -> None:
    assert installed("numpy") and installed("idna")
    assert not installed("os")  # the standard library
    assert not installed("not_a_package_anywhere_here")
