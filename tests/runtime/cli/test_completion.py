"""Shell completion, run in a real bash against the installed ``fnrt``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fnrt.runtime.cli.main import main


def _complete(script: str, *words: str) -> list[str]:
    """What bash offers after ``fnrt WORDS`` (the last word being typed)."""
    line = " ".join(f"'{w}'" for w in ("fnrt", *words))
    program = (
        f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; _fnrt_completion fnrt; "
        'echo "${COMPREPLY[@]}"'
    )
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(
        ["bash", "-c", program],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ | {"PATH": path},
        timeout=60,
    )
    return done.stdout.split()


def test_bash_completes_commands_subcommands_options_and_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    if not (Path(sys.executable).parent / "fnrt").exists():
        pytest.skip("fnrt is not installed beside this Python (pip install -e .)")
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert _complete(script, "de") == ["deploy", "describe", "dev"]
    assert _complete(script, "edge", "r") == ["run"]
    assert _complete(script, "serve", "--memory") == ["--memory-budget-bytes"]
    assert _complete(script, "edge", "run", "--emulate-b") == ["--emulate-bandwidth"]
    assert _complete(script, "serve", "--isolation", "") == ["process", "thread"]
    assert _complete(script, "completion", "") == ["bash", "zsh", "fish"]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_every_shell_gets_a_script_that_asks_fnrt(
    shell: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    assert "_FNRT_COMPLETE" in script and "fnrt" in script
