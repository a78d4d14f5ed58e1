"""docs/cli.md names every variable the CLI reads (the options declare them)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click

from fnrt.runtime.cli.main import cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def variables(command: click.Command) -> Iterator[str]:
    for param in command.params:
        if isinstance(param, click.Option) and param.envvar:
            yield from [param.envvar] if isinstance(param.envvar, str) else param.envvar
    if isinstance(command, click.Group):
        for child in command.commands.values():
            yield from variables(child)


def test_every_variable_an_option_reads_is_documented() -> None:
    documented = set(re.findall(r"`(FNRT_[A-Z0-9_]+)`", DOC.read_text()))
    read = set(variables(cli))
    assert read, "no option reads a variable"
    assert read <= documented, sorted(read - documented)
    assert documented <= read | {"FNRT_FUZZ_EXAMPLES"}, sorted(documented - read)
