"""What the routes share: the node (``fnrt.runtime.node``), on ``app.state``."""

from __future__ import annotations

from importlib import metadata

from starlette.requests import Request

from fnrt.runtime.node import Node

__all__ = ["Node", "node_of", "server_version"]


def node_of(request: Request) -> Node:
    node: Node = request.app.state.node
    return node


def server_version() -> str:
    """fnrt's installed version (``GET /v2``, ``/openapi.json``)."""
    try:
        return metadata.version("fnrt")
    except metadata.PackageNotFoundError:
        return "0+unknown"
