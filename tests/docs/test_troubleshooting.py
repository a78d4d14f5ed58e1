"""The messages docs/troubleshooting.md quotes are the ones the code makes: each is
matched, for most of its length, by a string or f-string of the server's source
(`{expressions}` matching anything), so a message reworded in the code fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from docsupport import docs_gen

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "troubleshooting.md"


def quoted() -> list[str]:
    """The messages of the page's code blocks: JSON errors, and the CLI's error lines."""
    found = []
    for block in re.findall(r"```\n(.*?)```", DOC.read_text(), flags=re.S):
        found += re.findall(r'"error": ?"((?:[^"\\]|\\.)*)"', block)
        found += re.findall(r"^(?:error|fnrt): (.*)$", block, flags=re.M)
    return found


def code_patterns() -> list[re.Pattern[str]]:
    gen = docs_gen()
    patterns = []
    for _, tree in gen._sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr | ast.Constant | ast.BinOp):
                text = gen._render(node)
                if text and len(re.sub(r"\{[^}]*\}", "", text)) >= 20:
                    parts = re.split(r"\{[^}]*\}", text)
                    patterns.append(re.compile(".+?".join(map(re.escape, parts))))
    return patterns


def test_every_quoted_message_is_made_by_the_code() -> None:
    messages = quoted()
    assert len(messages) >= 8, messages
    patterns = code_patterns()
    unknown = []
    for message in messages:
        best = max(
            (len(m.group(0)) for p in patterns if (m := p.search(message))),
            default=0,
        )
        if best < 0.5 * len(message):
            unknown.append(message)
    assert unknown == [], f"not made by the code (any more?): {unknown}"
