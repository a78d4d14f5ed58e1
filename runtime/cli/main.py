"""``fnrt``: serve functions, deploy them, invoke them, list and remove them.

Built on click: run ``fnrt COMMAND --help`` for each command's options; every
option that names a server, store, token or setting also reads the ``FNRT_*``
variable its help shows.
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from fnrt.client import ServerError
from fnrt.functions.errors import FnrtError
from fnrt.runtime.about import installed_version
from fnrt.runtime.cli import concurrency, dev, edge, job, simulate, summary, versions
from fnrt.runtime.cli.options import client_options, connect, input_options
from fnrt.runtime.cli.serve import serve
from fnrt.runtime.settings import ClientSettings, env_trace_settings, s3_config
from fnrt.tracing.setup import TraceConfig

EPILOG = "Docs: README.md and docs/ in the fnrt repository."
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _printable(value: object) -> object:
    """An element JSON has no type for: bytes as text, or as base64 when not UTF-8."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode("ascii")}
    raise TypeError(f"cannot print {type(value).__name__} as JSON")


@click.group(context_settings=CONTEXT, epilog=EPILOG)
@click.version_option(installed_version(), "--version", "-V", message="fnrt %(version)s")
def cli() -> None:
    """fnrt: deploy a model handler, get an HTTP endpoint."""


# --- deploy --------------------------------------------------------------------


@cli.command(short_help="deploy a function folder")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--name", help="function name (overrides the manifest's)")
@click.option(
    "--store",
    help="deploy straight into this store (folder or s3://bucket/prefix), no server; "
    "FNRT_STORE is not read here, so a deploy goes through the server unless you say so",
)
@click.option(
    "--s3-endpoint", envvar="FNRT_S3_ENDPOINT", show_envvar=True, help="S3-compatible endpoint URL"
)
@click.option(
    "--policy",
    type=click.Choice(["immediate", "canary"]),
    help="how traffic moves to the new version (default: the manifest's rollout.policy)",
)
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
@client_options
def deploy(
    path: Path,
    name: str | None,
    store: str | None,
    s3_endpoint: str | None,
    policy: str | None,
    as_json: bool,
    quiet: bool,
    client: ClientSettings,
) -> int:
    """Deploy the function in PATH (a folder holding fnrt.toml and its handler).

    Packs the folder, uploads the blobs the destination lacks, and moves traffic
    to the new version. Through a server, the new version is loaded, warmed up
    and probed first (a failure leaves the old one serving), then gets all
    traffic at once or step by step as a canary that rolls back on its own.
    It answers once the version's first call is readied (its files cached, and a
    spare worker that imported what its code imports: 30 s at most).
    Prints the version id; the same content always gets the same id.
    """
    from fnrt.functions.bundle import pack
    from fnrt.functions.manifest import load_manifest
    from fnrt.functions.version import VersionManifest
    from fnrt.runtime.cli.upload import upload_bundle

    if not path.is_dir():
        raise FnrtError(f"{path} is not a folder")
    manifest = load_manifest(path, name=name)
    bundle = pack(path, manifest)
    vm = VersionManifest(manifest, bundle.code_ref, bundle.artifacts)
    show = not quiet and sys.stderr.isatty()
    if store:
        if policy == "canary":
            raise FnrtError("a canary needs a server to watch it: deploy with --server")
        result = _deploy_to_store(store, s3_endpoint, bundle, vm, show)
    else:
        with connect(client) as server:
            count, size = upload_bundle(server, bundle, show_progress=show)
            result = server.deploy(vm, policy)
            result["uploaded_blobs"], result["uploaded_bytes"] = count, size
    if as_json:
        print(json.dumps(result))
    else:
        what = "deployed" if result["created"] else "already deployed"
        rollout = result.get("rollout", "immediate")
        how = {
            "canary": " (canary started: see `fnrt versions`)",
            "unchanged": " (already serving)",
        }.get(rollout, "")
        print(f"{result['name']} {result['version']} {what}{how}")
    return 0


def _deploy_to_store(
    store: str, s3_endpoint: str | None, bundle: Any, vm: Any, show: bool
) -> dict[str, Any]:
    from fnrt.loader.cache import BlobCache, CacheConfig
    from fnrt.loader.device import detect_device
    from fnrt.loader.instance import InstanceLoader
    from fnrt.loader.repository import Repository
    from fnrt.loader.stores import open_store
    from fnrt.runtime.cli.upload import upload_bundle
    from fnrt.runtime.deployment import publish_version

    repository = Repository(open_store(store, s3_config(s3_endpoint)))
    count, size = upload_bundle(repository, bundle, show_progress=show)
    with tempfile.TemporaryDirectory(prefix="fnrt-deploy-") as scratch:
        cache = BlobCache(CacheConfig(Path(scratch)))  # the handler is imported to validate it
        loader = InstanceLoader(repository, Path(scratch), detect_device("cpu"), cache)
        deployed = publish_version(repository, loader, vm)
    return {
        "name": deployed.name,
        "version": deployed.version,
        "created": deployed.created,
        "uploaded_blobs": count,
        "uploaded_bytes": size,
    }


# --- invoke --------------------------------------------------------------------


@cli.command(short_help="call a function")
@click.argument("name")
@input_options
@click.option(
    "--format",
    "wire",
    type=click.Choice(["msgpack", "json"]),
    default="msgpack",
    show_default=True,
    help="wire format",
)
@click.option(
    "--output", "-o", type=click.Path(path_type=Path), help="save outputs to this .npz file"
)
@click.option("--verbose", "-v", is_flag=True, help="print which version served, and the trace id")
@click.option(
    "--stream",
    is_flag=True,
    help="a generative function: print each chunk as it comes (text outputs as text)",
)
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="a generation parameter (max_new_tokens=20, temperature=0.8), repeatable",
)
@client_options
def invoke(
    name: str,
    inputs: dict[str, Any],
    wire: str,
    output: Path | None,
    verbose: bool,
    stream: bool,
    params: tuple[str, ...],
    client: ClientSettings,
) -> int:
    """Invoke function NAME once and print its outputs as JSON (or save them with
    --output). With --stream, a generative function's chunks are printed as they
    come, then why it ended and its usage (docs/generation.md)."""
    import numpy as np

    if stream or params:
        with connect(client) as server:
            return _stream(server, name, inputs, _parameters(params), stream)

    from fnrt.functions.codec import Format
    from fnrt.tracing.recorder import SpanKind
    from fnrt.tracing.setup import client_tracer
    from fnrt.tracing.spans import Tracing, fail, ids, inject

    fmt = Format.MSGPACK if wire == "msgpack" else Format.JSON
    config = {"service_name": "fnrt-cli", **env_trace_settings()}
    tracing = Tracing(client_tracer(TraceConfig(**config)))  # type: ignore[arg-type]
    span = tracing.start(f"fnrt invoke {name}", kind=SpanKind.CLIENT)
    trace_headers: dict[str, str] = {}
    inject(span, trace_headers)
    try:
        with connect(client) as server:
            result = server.invoke(name, inputs, format=fmt, headers=trace_headers)
    except Exception as exc:
        fail(span, exc)
        raise
    finally:
        if span is not None:
            span.end()
        tracing.shutdown()
    if output:
        save: Any = np.savez  # numpy's stub types **kwds as bool
        save(output, **{k: np.asarray(v) for k, v in result.items()})
        print(f"wrote {', '.join(result)} to {output}", file=sys.stderr)
    else:
        plain = {k: np.asarray(v).tolist() for k, v in result.items()}
        print(json.dumps(plain, default=_printable))
    if verbose:
        found = ids(span)
        trace = f", trace {found[0]}" if found else ""
        print(f"served by {result.version}{trace}", file=sys.stderr)
    return 0


def _parameters(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; a value that reads as JSON (20, 0.8, true) is that value."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--param")
        try:
            out[key] = json.loads(text)
        except ValueError:
            out[key] = text
    return out


def _stream(
    server: Any, name: str, inputs: dict[str, Any], parameters: dict[str, Any], live: bool
) -> int:
    """Print a generate stream: bytes outputs as text as they come, other outputs as a
    JSON line per chunk; then the finish reason and usage on stderr."""
    import numpy as np

    failed = False
    for event in server.generate(name, inputs, parameters):
        if event.kind == "chunk":
            texts = [v for v in event.data.values() if _is_text(v)]
            if texts:
                piece = b"".join(np.asarray(texts[0], dtype=object).reshape(-1))
                sys.stdout.write(piece.decode("utf-8", "replace"))
                sys.stdout.flush()
            else:
                plain = {k: np.asarray(v).tolist() for k, v in event.data.items()}
                print(json.dumps(plain, default=_printable), flush=live)
        elif event.kind == "done":
            usage = event.data.get("usage", {})
            print(file=sys.stdout)
            print(
                f"[{event.data.get('finish_reason')}: {usage.get('completion_tokens')} tokens, "
                f"first after {usage.get('time_to_first_token_ms')} ms, "
                f"{usage.get('time_per_output_token_ms')} ms per token]",
                file=sys.stderr,
            )
        else:
            print(file=sys.stdout)
            print(f"error: {event.data.get('error')}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


def _is_text(value: Any) -> bool:
    import numpy as np

    elements = np.asarray(value, dtype=object).reshape(-1)
    return elements.size > 0 and all(isinstance(e, bytes) for e in elements)


# --- ls / describe / rm / schema ---------------------------------------------------


@cli.command("ls", short_help="list functions")
@click.option("--json", "as_json", is_flag=True, help="the listing as JSON")
@client_options
def list_functions(as_json: bool, client: ClientSettings) -> int:
    """List deployed functions with their version and state (cold, loading, warm)."""
    with connect(client) as server:
        functions = server.list()
    if as_json:
        print(json.dumps(functions, indent=2))
        return 0
    rows = [("NAME", "VERSION", "STATE", "DESCRIPTION")] + [
        (f["name"], f["version"], f["state"], f["description"]) for f in functions
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print(
            "  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True))
            + "  "
            + row[3]
        )
    return 0


@cli.command(short_help="show one function")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="the whole describe document as JSON")
@client_options
def describe(name: str, as_json: bool, client: ClientSettings) -> int:
    """Summarise function NAME: its inputs and outputs, traffic, rollout, requests,
    latency, loads and restarts. --json prints the whole document (the manifest with
    every default, and every counter)."""
    with connect(client) as server:
        described = server.describe(name)
    print(json.dumps(described, indent=2) if as_json else summary.describe_text(described))
    return 0


@cli.command("rm", short_help="remove a function")
@click.argument("name")
@client_options
def remove(name: str, client: ClientSettings) -> int:
    """Remove function NAME's routing and version manifests (blobs stay in the store)."""
    with connect(client) as server:
        server.delete(name)
    print(f"removed {name}")
    return 0


@cli.command(short_help="print the JSON Schema of fnrt.toml (for editors)")
def schema() -> int:
    """Print the JSON Schema of a function manifest.

    Save it beside your fnrt.toml and start the file with
    '#:schema ./fnrt.schema.json': editors with a TOML language server (Taplo,
    Even Better TOML) then complete and check it.
    """
    from fnrt.functions.schema import manifest_schema

    print(json.dumps(manifest_schema(), indent=2))
    return 0


@cli.command(short_help="print shell completion for fnrt (bash, zsh or fish)")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> int:
    """Print the completion script for SHELL.

    eval "$(fnrt completion bash)" in ~/.bashrc, eval "$(fnrt completion zsh)" in
    ~/.zshrc, or fnrt completion fish > ~/.config/fish/completions/fnrt.fish.
    The script asks fnrt itself what to offer, so it always matches --help.
    """
    from fnrt.runtime.cli.completion import script

    print(script(cli, shell), end="")
    return 0


cli.add_command(serve)
cli.add_command(dev.dev)
cli.add_command(simulate.simulate)
cli.add_command(edge.edge)
cli.add_command(job.job)
cli.add_command(concurrency.bench_concurrency)
for command in versions.COMMANDS:
    cli.add_command(command)


def main(argv: list[str] | None = None) -> int:
    """Run ``fnrt`` with ``argv`` (default: the command line); the exit status."""
    try:
        code = cli.main(args=argv, prog_name="fnrt", standalone_mode=False)
    except click.ClickException as exc:  # a usage error: the message, exit 2
        exc.show()
        return exc.exit_code
    except click.Abort:
        return 130
    except ServerError as exc:
        print(f"fnrt: error {exc.status}: {exc.message}", file=sys.stderr)
        return 1
    except FnrtError as exc:
        print(f"fnrt: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
