"""``POST /v1/functions/{name}/invoke``: the data path."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fnrt.functions.codec import decode, encode, format_of, negotiate
from fnrt.functions.tensors import coerce_request
from fnrt.runtime.http.body import read_body
from fnrt.runtime.http.state import node_of

VERSION_HEADER = "x-fnrt-version"
FUNCTION_HEADER = "x-fnrt-function"
#: On a request that waited for a load: the tier the load came from (l2 disk, l3 store).
COLD_START_HEADER = "x-fnrt-cold-start"


async def invoke(request: Request) -> Response:
    node = node_of(request)
    fmt = format_of(request.headers.get("content-type"))
    reply = negotiate(request.headers.get("accept"), fmt)
    scheduler = await node.registry.get(request.path_params["name"])
    body = await read_body(request, node.settings.max_body_bytes)
    inputs = coerce_request(scheduler.version.manifest.inputs, decode(body, fmt))
    served = await scheduler.submit(inputs)
    headers = {FUNCTION_HEADER: scheduler.name, VERSION_HEADER: scheduler.version.version}
    if served.cold_tier is not None:
        headers[COLD_START_HEADER] = served.cold_tier
    return Response(encode(served.outputs, reply), media_type=reply.media_type, headers=headers)


routes = [Route("/v1/functions/{name}/invoke", invoke, methods=["POST"])]
