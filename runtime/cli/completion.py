"""``fnrt completion bash|zsh|fish``: click's shell completion, for ``fnrt``.

The script is a few lines that ask ``fnrt`` itself what to offer (through the
``_FNRT_COMPLETE`` variable), so it never drifts from ``--help``: every command,
sub-command, option and choice completes. Load it with
``eval "$(fnrt completion bash)"``.
"""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

#: The variable that, set, makes ``fnrt`` print completions instead of running.
COMPLETE_VAR = "_FNRT_COMPLETE"


def script(cli: click.Command, shell: str) -> str:
    """The completion script of ``cli`` as the program ``fnrt``, for ``shell``."""
    found = get_completion_class(shell)
    if found is None:
        raise click.BadParameter(f"no completion for {shell!r}: use bash, zsh or fish")
    return found(cli, {}, "fnrt", COMPLETE_VAR).source() + "\n"
