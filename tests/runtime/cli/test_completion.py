"""Shell completion, run in a real bash."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from fnrt.runtime.cli.completion import commands
from fnrt.runtime.cli.main import build_parser, main


def _complete(script: str, *words: str) -> list[str]:
    """What bash offers after ``fnrt WORDS`` (the last word being typed)."""
    line = " ".join(f"'{w}'" for w in ("fnrt", *words))
    program = (
        f'{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; _fnrt; echo "${{COMPREPLY[@]}}"'
    )
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_bash_completes_commands_subcommands_and_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert _complete(script, "de") == ["deploy", "describe", "dev"]
    assert _complete(script, "edge", "r") == ["run"]
    assert _complete(script, "serve", "--memory") == ["--memory-budget-bytes"]
    assert _complete(script, "edge", "run", "--emulate-b") == ["--emulate-bandwidth"]
    assert _complete(script, "completion", "") == ["bash", "zsh"]
    assert _complete(
        script,
        "",
    )[:3] == ["completion", "deploy", "describe"]  # no options
    assert "--version" in _complete(script, "--")


def test_every_command_of_the_parser_is_in_the_script() -> None:
    found = dict(commands(build_parser()))
    assert {"serve", "deploy", "edge run", "edge plan", "schema", "versions"} <= set(found)
    assert "--request-log-file" in found["serve"] and "--version" in found[""]
