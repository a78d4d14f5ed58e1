"""Per-function Python environments: built once from the package index, shared by content.

A function whose manifest has ``[environment] requirements`` gets the packages
its node lacks installed into a folder of their own, which its worker
processes put first on their path (the node's own packages, fnrt among them,
stay underneath). The folder is named by the digest of what pip resolved,
so two functions (or two versions) whose requirements resolve alike share
one, and a node builds each once; ``requested/`` remembers which folder a
list of requirements resolved to, so a worker start needs no network.

Layout under ``cache_dir/envs``::

    <key>/site/          the installed packages (on PYTHONPATH of the workers)
    <key>/resolved.txt   what was installed, name==version per line
    requested/<digest>   the key a list of requirements resolved to
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fnrt.functions.errors import EnvironmentFailed

log = logging.getLogger("fnrt.loader")

#: How long pip may take to resolve, or to install, one environment.
PIP_TIMEOUT_S = 900.0
#: The last lines of pip's output an error carries.
_ERROR_LINES = 12


@dataclass(frozen=True)
class Environment:
    """A built environment: its key (the digest of what was installed) and folder."""

    key: str
    root: Path
    packages: tuple[str, ...]  # name==version of what it holds beyond the node's own

    @property
    def site(self) -> Path:
        """The folder the workers put first on their path."""
        return self.root / "site"

    def pythonpath(self, inherited: str | None) -> str:
        """``PYTHONPATH`` for a worker: this environment first, then what it had."""
        return os.pathsep.join(p for p in (str(self.site), inherited) if p)

    def worker_variables(self) -> dict[str, str]:
        """The environment variables of a worker in it: the server's, with this
        environment first on ``PYTHONPATH``."""
        return os.environ | {"PYTHONPATH": self.pythonpath(os.environ.get("PYTHONPATH"))}


def python_tag() -> str:
    """What makes an environment usable only by this interpreter (version, ABI, platform)."""
    return f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}"


class Environments:
    """The environments of one node, under ``root`` (``cache_dir/envs``)."""

    def __init__(self, root: Path, python: str = sys.executable) -> None:
        self.root = root
        self.python = python

    def built(self, requirements: Sequence[str]) -> Environment | None:
        """The environment for ``requirements`` if this node has built it, else None
        (a read of two small files: nothing is resolved or built)."""
        requested = self.root / "requested" / _digest([python_tag(), *sorted(requirements)])
        try:
            return self._ready(requested.read_text().strip())
        except OSError:  # not requested here yet
            return None

    def ensure(self, requirements: Sequence[str]) -> Environment:
        """The environment for ``requirements``: found, or resolved and built (blocking).

        Raises EnvironmentFailed with pip's own words when resolving or
        installing fails (no such package, no version that fits, no network).
        """
        requested = self.root / "requested" / _digest([python_tag(), *sorted(requirements)])
        if requested.is_file():
            found = self._ready(requested.read_text().strip())
            if found is not None:
                return found
        with self._locked("resolve-" + requested.name):
            packages = self._resolve(requirements)
            key = _digest([python_tag(), *packages])
            env = self._ready(key) or self._build(key, packages)
            requested.parent.mkdir(parents=True, exist_ok=True)
            _write_atomically(requested, key)
            return env

    def _ready(self, key: str) -> Environment | None:
        root = self.root / key
        listing = root / "resolved.txt"
        if not listing.is_file():
            return None
        return Environment(key, root, tuple(listing.read_text().split()))

    def _resolve(self, requirements: Sequence[str]) -> list[str]:
        """What pip would install beyond this node's packages, as sorted pins."""
        with tempfile.TemporaryDirectory(prefix="fnrt-env-") as scratch:
            wanted = Path(scratch) / "requirements.txt"
            wanted.write_text("\n".join(requirements) + "\n")
            report = Path(scratch) / "report.json"
            self._pip("resolving", "--dry-run", "--report", str(report), "-r", str(wanted))
            installs: list[dict[str, Any]] = json.loads(report.read_text()).get("install", [])
        pins = []
        for item in installs:
            name, version = item["metadata"]["name"], item["metadata"]["version"]
            url = item.get("download_info", {}).get("url", "")
            pins.append(f"{name} @ {url}" if item.get("is_direct") else f"{name}=={version}")
        return sorted(pins, key=str.lower)

    def _build(self, key: str, packages: list[str]) -> Environment:
        """Install ``packages`` (already resolved: no dependencies follow) into a new folder."""
        with self._locked("build-" + key):
            found = self._ready(key)
            if found is not None:  # built by another deploy while this one waited
                return found
            root = self.root / key
            shutil.rmtree(root, ignore_errors=True)  # a build killed half-way
            building = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=self.root))
            try:
                if packages:
                    site = building / "site"
                    self._pip("installing", "--no-deps", "--target", str(site), *packages)
                else:
                    (building / "site").mkdir()
                (building / "resolved.txt").write_text("".join(p + "\n" for p in packages))
                building.rename(root)
            except BaseException:
                shutil.rmtree(building, ignore_errors=True)
                raise
            log.info("built environment %s: %s", key, ", ".join(packages) or "(nothing missing)")
            found = self._ready(key)
            assert found is not None
            return found

    def _pip(self, doing: str, *args: str) -> None:
        argv = [self.python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        argv += ["--no-input", *args]
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=PIP_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise EnvironmentFailed(doing, f"pip took longer than {PIP_TIMEOUT_S:.0f} s") from None
        if done.returncode != 0:
            said = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
            errors = [line for line in said if line.startswith("ERROR")] or said
            raise EnvironmentFailed(
                doing, "\n".join(errors[-_ERROR_LINES:]) or f"pip exited {done.returncode}"
            )

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        """One builder at a time per name, across processes (deploys and nodes on this disk)."""
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with (locks / name).open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def _digest(lines: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:24]


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
