"""Per-function environments, built for real from the package index.

``humanize`` is in no extra of fnrt: only an environment has it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fnrt.functions.errors import EnvironmentFailed
from fnrt.loader.environment import Environments
from fnrt.loader.imports import installed_in

PACKAGE = "humanize==4.9.0"


def _built(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if (p / "resolved.txt").is_file())


def test_an_environment_is_built_once_and_shared_by_what_resolves_alike(tmp_path: Path) -> None:
    assert importlib.util.find_spec("humanize") is None, "the test needs humanize absent here"
    envs = Environments(tmp_path / "envs")
    assert envs.built([PACKAGE]) is None  # not built here: nothing resolved to find it
    first = envs.ensure([PACKAGE])
    assert envs.built([PACKAGE]) == first
    assert installed_in("humanize", first.site) and not installed_in("numpy", first.site)
    assert first.packages == (PACKAGE,)
    assert (first.site / "humanize" / "__init__.py").is_file()
    again = envs.ensure(["Humanize == 4.9.0"])  # other words, the same resolution
    assert again.key == first.key and _built(tmp_path / "envs") == [first.key]
    # what the node has already is not installed again: numpy resolves to nothing new
    nothing = envs.ensure(["numpy"])
    assert nothing.packages == () and nothing.key != first.key
    assert list(nothing.site.iterdir()) == []
    # a second look needs no resolving: a worker start never waits for the network
    envs.python = "/nonexistent/python"  # would fail if pip were run again
    assert envs.ensure([PACKAGE]).key == first.key


def test_a_requirement_that_cannot_be_met_says_what_pip_said(tmp_path: Path) -> None:
    envs = Environments(tmp_path / "envs")
    with pytest.raises(EnvironmentFailed) as info:
        envs.ensure(["fnrt-no-such-package-4f1c0d==1.0"])
    message = str(info.value)
    assert message.startswith("the function's environment failed resolving its requirements:")
    assert "fnrt-no-such-package-4f1c0d" in message
    assert _built(tmp_path / "envs") == []
