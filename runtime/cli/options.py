"""The value types of fnrt's flags, and the options several commands share.

Every option is declared once, with click, together with the environment
variable it also reads: a flag wins over the variable, which wins over the
default, and ``--help`` shows both (``[env var: FNRT_PORT]``). A server
setting's default is the one :class:`~fnrt.runtime.settings.ServerSettings`
declares; :func:`setting` reads it from there rather than repeating it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import click

from fnrt.client import Client
from fnrt.functions.codec import decode_json, decode_msgpack
from fnrt.functions.errors import FnrtError
from fnrt.runtime.settings import DEFAULT_SERVER, ClientSettings, ServerSettings
from fnrt.runtime.units import format_bytes, parse_bytes, parse_seconds

F = TypeVar("F", bound=Callable[..., Any])


class Size(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.5 only
    """A ``*-bytes`` value: ``2GiB``, ``512MB`` or a number of bytes."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_bytes(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Duration(click.ParamType):  # type: ignore[type-arg]
    """A ``*-s`` value: ``250ms``, ``5m`` or a number of seconds."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float | int):
            return float(value)
        try:
            return parse_seconds(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Listed(click.ParamType):  # type: ignore[type-arg]
    """Comma-separated values of one type: ``--nodes 4,16`` (with ``multiple=True``,
    ``--nodes 4 --nodes 16`` too; :func:`flat` joins the lists)."""

    def __init__(self, item: click.ParamType) -> None:  # type: ignore[type-arg]
        self.item = item
        self.name = f"{item.name}[,...]"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> list[Any]:
        if isinstance(value, list):
            return value
        parts = [part.strip() for part in str(value).split(",")]
        return [self.item.convert(part, param, ctx) for part in parts if part]

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[Any]:
        return self.item.shell_complete(ctx, param, incomplete)


def flat(lists: Iterable[list[Any]] | None) -> list[Any]:
    """A repeatable :class:`Listed` option's values as one list."""
    return [value for values in lists or () for value in values]


SIZE = Size()
DURATION = Duration()

_SERVER_FIELDS = {f.name: f for f in dataclasses.fields(ServerSettings)}


def server_default(name: str) -> Any:
    """The default of a :class:`ServerSettings` field (None where it is computed, or
    where ``name`` is an option of ``fnrt serve`` that is no field)."""
    field = _SERVER_FIELDS.get(name)
    if field is None or field.default is dataclasses.MISSING:
        return None
    return field.default


def setting(
    name: str,
    *decls: str,
    help: str,
    type: Any = None,
    default_text: str | None = None,
    **kwargs: Any,
) -> Callable[[F], F]:
    """An option for the :class:`ServerSettings` field ``name``: ``--name-with-dashes``
    (unless ``decls`` name it) reading ``FNRT_NAME``. Its default is the dataclass's
    (sizes written with units); where that is computed, the option is None unless
    given and ``--help`` shows ``default_text``."""
    default = kwargs.pop("default", server_default(name))
    if default_text is None and default not in (None, ()):
        kwargs["default"] = format_bytes(default) if type is SIZE else default
        show: str | bool = not isinstance(default, bool)
    else:
        show = default_text or False
    return click.option(
        *(decls or (f"--{name.replace('_', '-')}",)),
        name,
        type=type,
        envvar=f"FNRT_{name.upper()}",
        show_envvar=True,
        show_default=show,
        help=help,
        **kwargs,
    )


def flag(name: str, *decls: str, help: str) -> Callable[[F], F]:
    """A boolean :func:`setting`: the flag, or its variable set to 1/true/yes/on
    (0/false/no/off for a ``--no-...`` flag's)."""
    return setting(name, *decls, help=help, is_flag=True, default=bool(server_default(name)))


LOG_LEVEL = click.Choice(["debug", "info", "warning", "error"])

host_option = setting("host", help="address to bind")
port_option = setting("port", type=int, help="port to listen on")


def _default_server() -> str:
    """``FNRT_PORT`` alone points the client commands at a local server on that port."""
    port = os.environ.get("FNRT_PORT")
    return f"http://127.0.0.1:{int(port)}" if port and port.isdigit() else DEFAULT_SERVER


server_option = click.option(
    "--server",
    envvar="FNRT_SERVER",
    show_envvar=True,
    default=_default_server,
    show_default=f"{DEFAULT_SERVER}, or on port FNRT_PORT",
    help="the fnrt server's URL",
)


def client_options(command: F) -> F:
    """``--server``, ``--token`` and ``--timeout-s``, given to ``command`` as one
    ``client: ClientSettings`` argument."""

    @functools.wraps(command)
    def run(*args: Any, server: str, token: str | None, timeout_s: float, **kw: Any) -> Any:
        return command(*args, client=ClientSettings(server, token, timeout_s), **kw)

    for option in (
        click.option(
            "--timeout-s",
            type=DURATION,
            envvar="FNRT_TIMEOUT_S",
            show_envvar=True,
            default=ClientSettings.timeout_s,
            show_default=True,
            help="give up on a request to the server after this long",
        ),
        click.option(
            "--token",
            envvar="FNRT_ADMIN_TOKEN",
            show_envvar=True,
            help="bearer token for the admin routes",
        ),
        server_option,
    ):
        run = option(run)
    return run  # type: ignore[return-value]


def connect(settings: ClientSettings) -> Client:
    """The client a command calls the server with."""
    return Client(settings.server, token=settings.token, timeout_s=settings.timeout_s)


def input_options(command: F) -> F:
    """``--json`` and ``--input``, given to ``command`` as ``inputs: dict`` (read and
    decoded: a missing file or a bad value is an FnrtError before anything is sent)."""

    @functools.wraps(command)
    def run(*args: Any, json_text: str | None, input_files: tuple[str, ...], **kw: Any) -> Any:
        return command(*args, inputs=read_inputs(json_text, input_files), **kw)

    for option in (
        click.option(
            "--input",
            "-i",
            "input_files",
            multiple=True,
            metavar="FILE",
            help="inputs from a .json, .msgpack or .npz file, or NAME=FILE.npy; repeatable",
        ),
        click.option(
            "--json", "json_text", help="inputs as a JSON object, e.g. '{\"x\": [[1, 2]]}'"
        ),
    ):
        run = option(run)
    return run  # type: ignore[return-value]


def read_inputs(json_text: str | None, input_files: Iterable[str]) -> dict[str, Any]:
    """The named tensors of ``--json`` and every ``--input`` file."""
    import numpy as np

    inputs: dict[str, Any] = {}
    if json_text is not None:
        inputs.update(decode_json(json_text.encode()))
    for item in input_files:
        name, sep, path_text = item.rpartition("=")
        path = Path(path_text)
        if not path.is_file():
            raise FnrtError(f"input file {path} does not exist")
        suffix = path.suffix.lower()
        if suffix == ".npy":
            if not sep:
                raise FnrtError(f"name the input of {path}: --input NAME={path}")
            inputs[name] = np.load(path, allow_pickle=False)
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as npz:
                inputs.update({k: npz[k] for k in npz.files})
        elif suffix == ".json":
            inputs.update(decode_json(path.read_bytes()))
        elif suffix in (".msgpack", ".mpk"):
            inputs.update(decode_msgpack(path.read_bytes()))
        else:
            raise FnrtError(f"{path}: use a .json, .msgpack, .npz or NAME=.npy file")
    if not inputs:
        raise FnrtError("give the inputs with --json '{...}' or --input FILE")
    return inputs
