"""``fnrt completion bash|zsh``: shell completion made from the parser itself.

The script holds every command (``edge run`` included) and its options, so it
never drifts from ``--help``; load it with ``eval "$(fnrt completion bash)"``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator


def commands(parser: argparse.ArgumentParser, prefix: str = "") -> Iterator[tuple[str, list[str]]]:
    """(command path, its options) for the parser and every sub-command below it."""
    options = sorted(
        flag
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction)
        for flag in action.option_strings
        if flag.startswith("--")
    )
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    names = sorted(subs[0].choices) if subs else []
    positional = [  # a positional argument's fixed choices (fnrt completion bash|zsh)
        str(choice)
        for action in parser._actions
        if not action.option_strings and not isinstance(action, argparse._SubParsersAction)
        for choice in action.choices or ()
    ]
    yield prefix, options + names + positional
    for sub in subs:
        for name, child in sorted(sub.choices.items()):
            yield from commands(child, f"{prefix} {name}".strip())


def bash_script(parser: argparse.ArgumentParser) -> str:
    """A bash completion function for ``fnrt`` (zsh loads it through bashcompinit)."""
    cases = "\n".join(
        f'        "{path}") words="{" ".join(words)}" ;;' for path, words in commands(parser)
    )
    return f"""# fnrt completion: eval "$(fnrt completion bash)" in ~/.bashrc
_fnrt() {{
    local cur path="" word i
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        [[ "$word" == -* ]] && continue
        case "${{path:+$path }}$word" in
{_known(parser)}) path="${{path:+$path }}$word" ;;
        esac
    done
    local words=""
    case "$path" in
{cases}
    esac
    if [[ "$cur" != -* ]]; then  # a word, not an option: commands and choices only
        words=$(printf '%s\n' $words | grep -v '^-')
    fi
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
    [[ ${{#COMPREPLY[@]}} -eq 0 && "$cur" != -* ]] && COMPREPLY=($(compgen -f -- "$cur"))
    return 0
}}
complete -F _fnrt fnrt
"""


def zsh_script(parser: argparse.ArgumentParser) -> str:
    return "autoload -U +X bashcompinit && bashcompinit\n" + bash_script(parser)


def _known(parser: argparse.ArgumentParser) -> str:
    return "            " + "|".join(f'"{path}"' for path, _ in commands(parser) if path)
