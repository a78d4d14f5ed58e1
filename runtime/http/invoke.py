"""``POST /v1/functions/{name}/invoke``: the data path."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fnrt.functions.codec import decode, encode, format_of, negotiate
from fnrt.functions.errors import BadRequest
from fnrt.functions.tensors import coerce_request
from fnrt.runtime.http.body import read_body
from fnrt.runtime.http.state import node_of
from fnrt.runtime.queue import Priority
from fnrt.runtime.result_cache import inputs_key

VERSION_HEADER = "x-fnrt-version"
FUNCTION_HEADER = "x-fnrt-function"
#: On a request that waited for a load: the tier the load came from (l2 disk, l3 store).
COLD_START_HEADER = "x-fnrt-cold-start"
#: "hit" when the answer came from the function's result cache.
CACHE_HEADER = "x-fnrt-cache"
PRIORITY_HEADER = "x-fnrt-priority"
TIMEOUT_HEADER = "x-fnrt-timeout-ms"


def request_options(request: Request) -> tuple[Priority | None, float | None]:
    """Priority and timeout (seconds) from the request headers; BadRequest if malformed."""
    priority = None
    if PRIORITY_HEADER in request.headers:
        try:
            priority = Priority.parse(request.headers[PRIORITY_HEADER])
        except ValueError as exc:
            raise BadRequest(f"{PRIORITY_HEADER}: {exc}") from None
    timeout_s = None
    if TIMEOUT_HEADER in request.headers:
        text = request.headers[TIMEOUT_HEADER]
        try:
            timeout_s = float(text) / 1000.0
        except ValueError:
            raise BadRequest(
                f"{TIMEOUT_HEADER}: {text!r} is not a number of milliseconds"
            ) from None
        if not timeout_s > 0:
            raise BadRequest(f"{TIMEOUT_HEADER}: must be > 0")
    return priority, timeout_s


async def invoke(request: Request) -> Response:
    node = node_of(request)
    fmt = format_of(request.headers.get("content-type"))
    reply = negotiate(request.headers.get("accept"), fmt)
    priority, timeout_s = request_options(request)
    scheduler = await node.registry.get(request.path_params["name"])
    body = await read_body(request, node.settings.max_body_bytes)
    inputs = coerce_request(scheduler.version.manifest.inputs, decode(body, fmt))
    headers = {FUNCTION_HEADER: scheduler.name, VERSION_HEADER: scheduler.version.version}
    cache = scheduler.result_cache
    if cache is not None:
        key = inputs_key(inputs)
        hit = cache.get(key)
        if hit is not None:
            headers[CACHE_HEADER] = "hit"
            return Response(encode(hit, reply), media_type=reply.media_type, headers=headers)
    served = await scheduler.submit(inputs, priority=priority, timeout_s=timeout_s)
    if cache is not None:
        cache.put(key, served.outputs)
    if served.cold_tier is not None:
        headers[COLD_START_HEADER] = served.cold_tier
    return Response(encode(served.outputs, reply), media_type=reply.media_type, headers=headers)


routes = [Route("/v1/functions/{name}/invoke", invoke, methods=["POST"])]
