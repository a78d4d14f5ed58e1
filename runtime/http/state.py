"""What the routes share: the node (``fnrt.runtime.node``), on ``app.state``."""

from __future__ import annotations

from starlette.requests import Request

from fnrt.runtime.about import installed_version
from fnrt.runtime.node import Node

__all__ = ["Node", "node_of", "server_version"]


def node_of(request: Request) -> Node:
    node: Node = request.app.state.node
    return node


#: fnrt's installed version (``GET /v2``, ``/openapi.json``).
server_version = installed_version
