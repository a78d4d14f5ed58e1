"""Compile the request path's hot modules with mypyc, beside their sources; or remove them.

    python mypyc_build.py            # build (skipped, with one line, without a compiler or mypyc)
    python mypyc_build.py --pure     # remove the compiled modules: the pure-Python path
    python mypyc_build.py --check    # say which of the hot modules are compiled now

``make`` runs it (``make compiled``, a step of ``make demo`` and ``make test``);
``FNRT_PURE=1`` (or ``make PURE=1``) keeps the pure-Python modules. Each compiled
module is an extension (``runtime/queue.cpython-311-*.so``) next to its ``.py``:
Python imports the extension when both are there, so removing the ``.so`` files
is all it takes to go back. The modules share one library,
``runtime/compiled__mypyc.*.so``, so their calls to each other are C calls.

mypyc compiles the code as mypy type-checks it (``make lint``'s strict mypy): no
other source exists. A module that mypyc refuses, or a build that fails, leaves
the pure modules in place and says so in one line: a missing or broken compiler
never stops ``make demo`` or ``make test``. What it saves: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent

#: The modules compiled, by source path (the request path: the data-route template,
#: input coercion, the request record and queue, admission, the batch loop).
HOT = (
    "functions/tensors.py",
    "runtime/queue.py",
    "runtime/intake.py",
    "runtime/batcher.py",
    "runtime/sequencer.py",  # an Intake too: a compiled class's subclasses are compiled
    "runtime/http/data.py",
)

#: The shared library's module (its .so lands in runtime/).
GROUP = "fnrt.runtime.compiled"

#: Source folder of each package (pyproject.toml's [tool.setuptools.package-dir]).
PACKAGE_DIRS = {
    "fnrt.client": "client",
    "fnrt.functions": "functions",
    "fnrt.loader": "loader",
    "fnrt.loader.stores": "loader/stores",
    "fnrt.loader.formats": "loader/formats",
    "fnrt.runtime": "runtime",
    "fnrt.runtime.http": "runtime/http",
    "fnrt.runtime.http.oip": "runtime/http/oip",
    "fnrt.runtime.prewarm": "runtime/prewarm",
    "fnrt.runtime.jobs": "runtime/jobs",
    "fnrt.runtime.cli": "runtime/cli",
    "fnrt.edge": "edge",
    "fnrt.tracing": "tracing",
}

EXTENSION = sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def compiled_files() -> list[Path]:
    """The extensions this build makes (those present now)."""
    found = [(ROOT / path).with_suffix(EXTENSION) for path in HOT]
    found.append(ROOT / "runtime" / f"compiled__mypyc{EXTENSION}")
    return [path for path in found if path.exists()]


def remove() -> int:
    """Remove the compiled modules; how many there were."""
    files = compiled_files()
    for path in files:
        path.unlink()
    return len(files)


def missing_tools() -> str | None:
    """Why nothing can be compiled here (None: it can)."""
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "mypyc is not installed (pip install mypy)"
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    program = compiler.split()[0]
    if shutil.which(program) is None:
        return f"no C compiler ({program} not found)"
    try:
        subprocess.run([program, "--version"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return f"the C compiler {program} does not run"
    return None


def build() -> None:
    """mypyc the hot modules into extensions beside their sources (raises if it fails)."""
    from mypyc.build import mypycify
    from setuptools import setup

    # mypy sees the folders under their import names, as `make lint` links them
    names = ROOT / ".typecheck" / "fnrt"
    names.mkdir(parents=True, exist_ok=True)
    for folder in ("client", "functions", "loader", "runtime", "tracing", "edge"):
        link = names / folder
        if not link.is_symlink():
            link.symlink_to(Path("..", "..", folder))
    paths = [str(Path(".typecheck", "fnrt", path)) for path in HOT]
    with tempfile.TemporaryDirectory(prefix="fnrt-mypyc-") as scratch, contextlib.chdir(ROOT):
        extensions = mypycify(
            [*paths, "--config-file", "pyproject.toml", "--explicit-package-bases"],
            group_name=GROUP,
            target_dir=str(Path(scratch) / "c"),
        )
        setup(
            name="fnrt-compiled",
            package_dir=PACKAGE_DIRS,
            ext_modules=extensions,
            script_args=[
                "--quiet",
                "build_ext",
                "--inplace",
                "--build-temp",
                str(Path(scratch) / "temp"),
            ],
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pure", action="store_true", help="remove the compiled modules")
    parser.add_argument("--check", action="store_true", help="list the compiled modules")
    args = parser.parse_args()
    if args.check:
        files = compiled_files()
        for path in files:
            print(path.relative_to(ROOT))
        print(f"{len(files)} of {len(HOT) + 1} compiled")
        return 0
    if args.pure or os.environ.get("FNRT_PURE", "") not in ("", "0"):
        removed = remove()
        print(f"mypyc: pure Python (FNRT_PURE or --pure): removed {removed} compiled modules")
        return 0
    why = missing_tools()
    if why is not None:
        remove()
        print(f"mypyc: skipped, {why}: the hot modules run as pure Python")
        return 0
    remove()  # a half-built set must not shadow some sources and not others
    try:
        build()
    except (Exception, SystemExit) as exc:
        remove()
        print(f"mypyc: the build failed ({exc!r:.200}): the hot modules run as pure Python")
        return 0
    print(f"mypyc: compiled {len(compiled_files()) - 1} hot modules (FNRT_PURE=1 to turn off)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
