"""What the routes share: the node's settings and registry, on ``app.state``."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from starlette.requests import Request

from fnrt.runtime.registry import Registry
from fnrt.runtime.settings import ServerSettings


@dataclass(frozen=True)
class Node:
    settings: ServerSettings
    registry: Registry


def node_of(request: Request) -> Node:
    node: Node = request.app.state.node
    return node


def server_version() -> str:
    """fnrt's installed version (``GET /v2``, ``/openapi.json``)."""
    try:
        return metadata.version("fnrt")
    except metadata.PackageNotFoundError:
        return "0+unknown"
