"""Write the reference pages of docs/reference/ from the code, so they cannot drift.

    python docs/gen.py           # (make docs) write the pages
    python docs/gen.py --check   # exit 1, naming the pages that differ from what the code says

- manifest.md: every section and key of fnrt.toml, from the manifest's pydantic
  model (types, bounds, defaults: its JSON Schema) and the source's comments;
- errors.md: every error class of functions/errors.py, the HTTP status the server
  maps it to (runtime/http/problems.py), and every place the code raises it, with
  the words it passes;
- metrics.md: every series of tracing/, with its type, labels and help text;
- cli.md: every command's --help, from click, and the bounds ``fnrt serve`` checks
  its options against (ServerSettings' and TensorLimits' ``__post_init__``).

tests/docs/test_reference.py fails when a page on disk is not what this writes.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference"
#: The folders of the server's code (what raises the errors a node answers with).
SOURCES = ("functions", "loader", "runtime", "tracing")
HEADER = "<!-- Made by docs/gen.py from the code (make docs); edits here are overwritten. -->\n\n"


def _prose(doc: str | None) -> str:
    """A docstring as Markdown: dedented, rst ``literals`` as `code`."""
    text = inspect.cleandoc(doc or "")
    return re.sub(r"``(.+?)``", r"`\1`", text)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# --- the manifest ----------------------------------------------------------------------


def _comments(path: Path) -> dict[tuple[str, str], str]:
    """(class, key) -> the `#:` lines above the key and the comment after it."""
    lines = path.read_text().splitlines()
    found: dict[tuple[str, str], str] = {}
    for node in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            said: list[str] = []
            above = item.lineno - 2
            while above >= 0 and lines[above].strip().startswith("#:"):
                said.insert(0, lines[above].strip().removeprefix("#:").strip())
                above -= 1
            last = lines[(item.end_lineno or item.lineno) - 1]
            if "  # " in last:
                said.append(last.split("  # ", 1)[1].strip())
            if said:
                found[(node.name, item.target.id)] = " ".join(said)
    return found


def _type(spec: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in spec:
        return "table"
    if "enum" in spec:
        return " | ".join(json.dumps(v) for v in spec["enum"])
    if "anyOf" in spec:
        return " or ".join(_type(s, defs) for s in spec["anyOf"])
    kind = spec.get("type", "any")
    if kind == "array":
        items = spec.get("items") or spec.get("prefixItems") or {}
        inner = _type(items, defs) if isinstance(items, dict) else "any"
        kind = f"array of {inner}"
    elif kind == "object":
        values = spec.get("additionalProperties")
        pattern = next(iter(spec.get("patternProperties", {}).values()), None)
        inner = pattern or (values if isinstance(values, dict) else None)
        kind = f"table of {_type(inner, defs)}" if inner else "table"
    if "exclusiveMinimum" in spec:
        spec = {k: v for k, v in spec.items() if k != "minimum"}
    bounds = [
        f"{sign} {spec[key]}"
        for key, sign in (
            ("minimum", "≥"),
            ("exclusiveMinimum", ">"),
            ("maximum", "≤"),
            ("exclusiveMaximum", "<"),
            ("minLength", "length ≥"),
            ("maxLength", "length ≤"),
        )
        if key in spec
    ]
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def manifest_page() -> str:
    from fnrt.functions import manifest as m
    from fnrt.functions.schema import manifest_schema

    schema = manifest_schema()
    defs = schema["$defs"]
    said = _comments(Path(m.__file__))
    out = [
        "# fnrt.toml, key by key\n",
        "Every section and key a function's manifest may hold, with its type, bounds,",
        "default and what it does, made from the manifest's model",
        "(`functions/manifest.py`). A key not listed is refused at deploy (422, naming",
        "it). `fnrt schema` prints the same as a JSON Schema for editors. The guide",
        "with examples: [handlers.md](../handlers.md).\n",
    ]

    def table(cls_name: str, props: dict[str, Any], required: tuple[str, ...] = ()) -> list[str]:
        rows = ["| key | type | default | what it does |", "|---|---|---|---|"]
        for key, spec in props.items():
            words = [
                spec.get("description", "")
                if spec.get("description") not in ("seconds", "milliseconds")
                else "",
                said.get((cls_name, key), ""),
            ]
            if "$ref" in spec:
                words.append(f"see [`[{key}]`](#{key})")
            default = json.dumps(spec["default"]) if "default" in spec else "(unset)"
            if key in required:
                default = "(required)"
            if "$ref" in spec or key in ("inputs", "outputs", "artifacts"):
                default = "{}" if key in ("inputs", "outputs", "artifacts") else "the section's"
            unit = {"seconds": " (seconds)", "milliseconds": " (milliseconds)"}.get(
                spec.get("description", ""), ""
            )
            what = "; ".join(w for w in words if w)
            kind = _cell(_type(spec, defs) + unit)
            rows.append(f"| `{key}` | {kind} | `{default}` | {_cell(what)} |")
        return rows

    out += ["## The top level\n", *table("Manifest", schema["properties"], ("name", "handler")), ""]
    for key, spec in schema["properties"].items():
        ref = spec.get("$ref") or next(
            (s["$ref"] for s in spec.get("anyOf", []) if "$ref" in s), None
        )
        if ref is None:
            continue
        name = ref.rsplit("/", 1)[1]
        section = defs[name]
        doc = _prose(getattr(m, name).__doc__)
        out += [f"## `[{key}]`\n", doc, "", *table(name, section["properties"]), ""]
    tensor = defs["TensorSpec"]
    out += [
        "## An input or an output (`[inputs]`, `[outputs]`)\n",
        "Each entry is `name = { dtype = ..., shape = [...] }`; a tensor name is "
        "`[A-Za-z0-9_.:/-]`.\n",
        *table("TensorSpec", tensor["properties"]),
        "",
    ]
    return "\n".join(out)


# --- errors ------------------------------------------------------------------------------


def _render(node: ast.expr) -> str | None:
    """A string literal or an f-string as the text it makes, `{expressions}` kept."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                parts.append("{" + ast.unparse(value.value) + "}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _render(node.left), _render(node.right)
        if left is not None and right is not None:
            return left + right
    if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "HTTPStatus":
        status = HTTPStatus[node.attr]  # as its status line says it
        return f"{status.value} {status.phrase}"
    return None


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            yield rel, ast.parse(path.read_text(), rel)


def _raised(names: set[str]) -> dict[str, list[tuple[str, str]]]:
    """class name -> (module, the words it is given) for every construction outside
    functions/errors.py."""
    sites: dict[str, list[tuple[str, str]]] = {}
    for rel, tree in _sources():
        if rel == "functions/errors.py":
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name not in names:
                continue
            words = [w for a in node.args if (w := _render(a)) is not None]
            entry = (rel, " … ".join(words))
            if entry not in sites.setdefault(name, []):
                sites[name].append(entry)
    return sites


def _template(cls_node: ast.ClassDef) -> str | None:
    """The message a class's own __init__ makes (its first string-ish argument up)."""
    for node in ast.walk(cls_node):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "__init__"
        ):
            for arg in node.args:
                if (text := _render(arg)) is not None:
                    return text
    return None


def _written_answers() -> list[tuple[str, str, str]]:
    """(status line, error, module) of the answers written straight to a connection."""
    found = []
    for rel, tree in _sources():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("_closing_answer", "RefusedHead")
                and len(node.args) >= 2
            ):
                status, error = _render(node.args[0]), _render(node.args[1])
                if status and error:
                    found.append((status, error, rel))
    return found


def _status_table() -> list[tuple[str, int]]:
    """runtime/http/problems.py's ``_STATUS``, read from its source (class name, status),
    in order: the first class an error is an instance of gives its status."""
    tree = ast.parse((ROOT / "runtime/http/problems.py").read_text())
    for node in tree.body:
        target = getattr(node, "target", None) or next(iter(getattr(node, "targets", [])), None)
        if isinstance(target, ast.Name) and target.id == "_STATUS":
            value = getattr(node, "value", None)
            return [
                (ast.unparse(pair.elts[0]).split(".")[-1], ast.literal_eval(pair.elts[1]))
                for pair in getattr(value, "elts", [])
            ]
    raise LookupError("runtime/http/problems.py has no _STATUS table")


def errors_page() -> str:
    from fnrt.functions import errors as e

    mapping = _status_table()
    path = Path(e.__file__)
    tree = ast.parse(path.read_text())
    nodes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    classes = [
        getattr(e, name)
        for name in nodes
        if isinstance(getattr(e, name, None), type) and issubclass(getattr(e, name), e.FnrtError)
    ]

    def status(cls: type) -> int:
        return next((code for base, code in mapping if issubclass(cls, getattr(e, base))), 400)

    sites = _raised({c.__name__ for c in classes})
    out = [
        "# HTTP errors, cause by cause\n",
        "Every error fnrt answers with is one class of `functions/errors.py`; its body is",
        '`{"error": "<message>", ...fields}` in the request\'s format (JSON or msgpack), and',
        "`runtime/http/problems.py` alone maps the class to the status below (a subclass",
        "takes its first match). For each: what it means, the message it carries, and",
        "every place in the code that raises it with the words it passes (`{…}` is filled",
        "in at run time). What to do about the common ones:",
        "[troubleshooting.md](../troubleshooting.md).\n",
        "| status | class | meaning |",
        "|---|---|---|",
    ]
    ordered = sorted(classes, key=lambda c: status(c))
    for cls in ordered:
        first = _prose(cls.__doc__).split("\n\n")[0]
        link = f"[`{cls.__name__}`](#{cls.__name__.lower()})"
        out.append(f"| {status(cls)} | {link} | {_cell(first)} |")
    out.append("")
    for cls in ordered:
        parent = cls.__mro__[1]
        kind = f", a kind of `{parent.__name__}`" if parent not in (e.FnrtError, Exception) else ""
        about = _prose(cls.__doc__).replace("\n", " ")
        out += [f"## {cls.__name__}\n", f"**{status(cls)}**{kind}. {about}", ""]
        template = _template(nodes[cls.__name__])
        if template:
            out += [f"Message: `{template}`\n"]
        rows = sites.get(cls.__name__, [])
        if rows:
            out += ["| raised in | with |", "|---|---|"]
            out += [f"| `{rel}` | {_cell('`' + w + '`') if w else ''} |" for rel, w in rows]
            out.append("")
    written = _written_answers()
    if written:
        out += [
            "## Answers written before a request reaches the app\n",
            "The connection layer answers these itself and closes the connection:\n",
            "| status | error | in |",
            "|---|---|---|",
            *[f"| {s} | `{_cell(m)}` | `{rel}` |" for s, m, rel in written],
            "",
        ]
    return "\n".join(out)


# --- metrics ------------------------------------------------------------------------------

_KINDS = {
    "Counter": "counter",
    "LoopCounter": "counter",
    "CounterMetricFamily": "counter",
    "Histogram": "histogram",
    "LoopHistogram": "histogram",
    "HistogramMetricFamily": "histogram",
    "Gauge": "gauge",
    "GaugeMetricFamily": "gauge",
    "StateGauge": "gauge",
}


def metric_series() -> list[tuple[str, str, list[str], str, str]]:
    """(name as scraped, type, labels, help, module) of every fnrt_ series in tracing/."""
    found = []
    for path in sorted((ROOT / "tracing").glob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            kind = _KINDS.get(node.func.id)
            if kind is None or not node.args:
                continue
            name = _render(node.args[0])
            if not name or not name.startswith("fnrt_"):
                continue
            doc = _render(node.args[1]) if len(node.args) > 1 else None
            labels_node = next((k.value for k in node.keywords if k.arg == "labels"), None)
            if labels_node is None and len(node.args) > 2:
                labels_node = node.args[2]
            labels = [
                v for elt in getattr(labels_node, "elts", []) if (v := _render(elt)) is not None
            ]
            if kind == "counter" and not name.endswith("_total"):
                name += "_total"
            found.append((name, kind, labels, doc or "", rel))
    return sorted(found)


def metrics_page() -> str:
    out = [
        "# Metrics, series by series\n",
        "What `GET /metrics` serves (Prometheus text format), made from the series",
        "defined in `tracing/`. A histogram is scraped as `_bucket`, `_sum` and `_count`;",
        "the process's own `process_*` series (resident memory, CPU, descriptors) come",
        "with them. What to do with them: [observability.md](../observability.md).\n",
        "| series | type | labels | what it counts |",
        "|---|---|---|---|",
    ]
    for name, kind, labels, doc, _ in metric_series():
        shown = ", ".join(f"`{label}`" for label in labels)
        out.append(f"| `{name}` | {kind} | {shown} | {_cell(doc)} |")
    return "\n".join(out) + "\n"


# --- the CLI ------------------------------------------------------------------------------


def cli_page() -> str:
    import click

    from fnrt.runtime.cli.main import cli

    out = [
        "# The fnrt command, command by command\n",
        "Each command's `--help`, as `fnrt` prints it (made from its click",
        "definitions). Flags that read an environment variable say which. The guide:",
        "[cli.md](../cli.md).\n",
    ]

    def walk(command: click.Command, path: list[str], parent: click.Context | None) -> None:
        ctx = click.Context(
            command,
            info_name=path[-1],
            parent=parent,
            terminal_width=88,
            max_content_width=88,
            # as `fnrt` names them (click keeps a command's help option from its first
            # context: without this the page would depend on whether main() ran first)
            help_option_names=cli.context_settings.get("help_option_names"),
        )
        if command.hidden:
            return
        title = " ".join(path)
        out.extend([f"## `{title}`\n", "```text", command.get_help(ctx).rstrip(), "```\n"])
        if title == "fnrt serve":
            out.extend(_bounds_table(command))
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None:
                    walk(sub, [*path, name], ctx)

    walk(cli, ["fnrt"], None)
    return "\n".join(out)


#: Where the settings' bounds are checked: (file, class) whose __post_init__ raises
#: ValueError("field: must ..."), and the setting a field of it is given as.
BOUNDED = (("runtime/settings.py", "ServerSettings"), ("functions/limits.py", "TensorLimits"))


def _limit_settings() -> dict[str, str]:
    """runtime/settings.py's ``LIMIT_SETTINGS``: the setting of each TensorLimits field
    named otherwise, read from its source."""
    tree = ast.parse((ROOT / "runtime/settings.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "LIMIT_SETTINGS":
            found: dict[str, str] = ast.literal_eval(node.value)
            return found
    raise LookupError("runtime/settings.py has no LIMIT_SETTINGS")


SETTING_OF = _limit_settings()


def serve_bounds() -> dict[str, str]:
    """setting -> its bound ("must be at least 1024"), from the ``raise
    ValueError("field: must ...")`` lines of the settings' ``__post_init__``."""
    bounds: dict[str, str] = {}
    for rel, class_name in BOUNDED:
        tree = ast.parse((ROOT / rel).read_text(), rel)
        for cls in ast.walk(tree):
            if not (isinstance(cls, ast.ClassDef) and cls.name == class_name):
                continue
            for node in ast.walk(cls):
                called = getattr(node, "func", None)
                if not (isinstance(node, ast.Call) and getattr(called, "id", "") == "ValueError"):
                    continue
                text = _render(node.args[0]) if node.args else None
                if text is None or ": must " not in text:
                    continue
                fields, _, bound = text.partition(": must ")
                for name in fields.split(", "):
                    bounds.setdefault(SETTING_OF.get(name, name), f"must {bound}")
    return bounds


def _bounds_table(command: Any) -> list[str]:
    """The bounds of ``fnrt serve``'s options, as a table after its --help."""
    options = {p.name: p for p in command.params if p.name}
    rows = []
    for name, bound in sorted(serve_bounds().items()):
        param = options.get(name)
        if param is None:
            continue
        env = getattr(param, "envvar", None)
        flag = param.opts[0]
        rows.append(f"| `{flag}` | {f'`{env}`' if env else ''} | {_cell(bound)} |")
    return [
        "The bounds of its options: `fnrt serve` checks each before it starts, and",
        "exits with one line naming it otherwise (`error: max_json_body_bytes: must be",
        "at least 1024`).\n",
        "| option | variable | bound |",
        "|---|---|---|",
        *rows,
        "",
    ]


PAGES: dict[str, Callable[[], str]] = {
    "manifest.md": manifest_page,
    "errors.md": errors_page,
    "metrics.md": metrics_page,
    "cli.md": cli_page,
}


def pages() -> dict[Path, str]:
    made = {}
    for name, make in PAGES.items():
        text = HEADER + make()
        made[OUT / name] = text.rstrip("\n") + "\n"
    return made


def main(argv: list[str]) -> int:
    stale = []
    for path, text in pages().items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path.relative_to(ROOT).as_posix())
        if "--check" not in argv:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if "--check" in argv and stale:
        print("stale (run make docs): " + ", ".join(stale), file=sys.stderr)
        return 1
    for name in stale:
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
