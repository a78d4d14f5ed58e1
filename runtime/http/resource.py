"""One Starlette route per path, whatever methods it answers.

Starlette answers a method a route lacks with 405 and an ``Allow`` header
listing *that route's* methods; with one route per method, a path served by
several would advertise only the first. :func:`resource` gathers a path's
methods into one route, so ``Allow`` is always complete.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

Endpoint = Callable[[Request], Awaitable[Response]]


def resource(path: str, **by_method: Endpoint) -> Route:
    """A route for ``path`` calling ``by_method[METHOD]`` (``get=...``, ``post=...``).

    HEAD goes to the GET endpoint unless one is given for it.
    """
    endpoints = {method.upper(): endpoint for method, endpoint in by_method.items()}

    async def dispatch(request: Request) -> Response:
        endpoint = endpoints.get(request.method) or endpoints["GET"]
        return await endpoint(request)

    if len(endpoints) == 1:
        ((method, only),) = endpoints.items()
        return Route(path, only, methods=[method])
    return Route(path, dispatch, methods=list(endpoints))
