"""The image installs what the Makefile installs, every package folder of it, and runs
as a non-root user with ``fnrt serve`` as its entrypoint (read, not built: building
needs Docker Hub, which tests do not reach)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "infra" / "docker" / "Dockerfile").read_text()


def _instructions() -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    lines = [line.strip() for line in joined.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def test_it_installs_the_package_with_the_makefiles_constraints() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "-c constraints.txt" in makefile and "-c constraints.txt" in DOCKERFILE
    runs = [args for op, args in _instructions() if op == "RUN"]
    line = r'pip install -q -c constraints.txt .*"\.\[\$FNRT_EXTRAS\]"$'
    assert any(re.search(line, r) for r in runs), runs
    # the GPU image needs no index named: PyPI's torch is the CUDA build; a CPU index
    # is the builder's to give (TORCH_INDEX_URL, empty by default)
    assert "://" not in DOCKERFILE
    assert '${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"}' in DOCKERFILE
    args = dict(a.split("=", 1) for op, a in _instructions() if op == "ARG" and "=" in a)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert set(args["FNRT_EXTRAS"].split(",")) <= set(extras), args  # a server's extras


def test_every_package_folder_is_copied() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = {p.split("/")[0] for p in pyproject["tool"]["setuptools"]["package-dir"].values()}
    copied = {args.split()[0] for op, args in _instructions() if op == "COPY"}
    assert folders <= copied, folders - copied
    assert {"pyproject.toml", "constraints.txt"} <= set(
        " ".join(args for op, args in _instructions() if op == "COPY").split()
    )


def test_it_runs_fnrt_serve_as_a_user_that_is_not_root() -> None:
    ops = _instructions()
    users = [args for op, args in ops if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    (entrypoint,) = [args for op, args in ops if op == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["fnrt", "serve"]
    assert "FNRT_HOST=0.0.0.0" in DOCKERFILE  # reachable in its pod; the token guards admin
