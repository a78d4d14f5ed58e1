"""The OpenAPI 3.1 document of the whole HTTP API, served at ``GET /openapi.json``,
and browsable at ``GET /docs``.

Written by hand from the routes (``tests/runtime/http/test_openapi.py`` checks
that every route is here and nothing else is, and schemathesis checks the
server against it). The served document also has one path per function this
node serves, ``/v1/functions/NAME/invoke``, whose request and response schemas
come from the function's declared inputs and outputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from fnrt.functions.dtypes import DTYPE_OF_DATATYPE, DTYPES
from fnrt.functions.manifest import NAME_PATTERN, Manifest, TensorSpec
from fnrt.runtime.access import allows
from fnrt.runtime.http.oip.spec import paths as v2_paths
from fnrt.runtime.http.oip.spec import tensor_metadata
from fnrt.runtime.http.spec import (
    DIGEST,
    FUNCTION_STATE,
    INVOKE_HEADERS,
    JSON,
    MSGPACK,
    NAME,
    OCTETS,
    Schema,
    admin_op,
    data_error_responses,
    error_responses,
    generate_path,
    invoke_path,
    ok,
    path_param,
    ref,
)
from fnrt.runtime.http.state import server_version


def _query(name: str, schema: Schema, description: str | None = None) -> Schema:
    """An optional query parameter."""
    param: Schema = {"name": name, "in": "query", "schema": schema}
    if description is not None:
        param["description"] = description
    return param


def _v1_versions() -> dict[str, Schema]:
    """Versions, traffic, rollback and failures (docs/rollout.md)."""
    traffic = {
        "type": "object",
        "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 100},
        "description": "version id -> percent of requests, summing to 100",
    }
    routing = {
        "type": "object",
        "required": ["traffic"],
        "properties": {"traffic": traffic, "previous": {"type": "array"}},
    }
    return {
        "/v1/functions/{name}/versions": {
            "parameters": [NAME],
            "get": admin_op(
                "Versions with their share, state and breaker; the rollout",
                "versions",
                ok(
                    {
                        "type": "object",
                        "required": ["name", "traffic", "versions"],
                        "properties": {
                            "name": {"type": "string"},
                            "traffic": traffic,
                            "versions": {"type": "array", "items": {"type": "object"}},
                        },
                    }
                ),
                404,
            ),
        },
        "/v1/functions/{name}/traffic": {
            "parameters": [NAME],
            "put": admin_op(
                "Split traffic by hand (stops a canary)",
                "setTraffic",
                ok(routing),
                400,
                404,
                409,
                413,
                requestBody={
                    "required": True,
                    "content": {
                        JSON: {
                            "schema": {
                                "type": "object",
                                "required": ["traffic"],
                                "properties": {"traffic": traffic},
                            },
                            "example": {"traffic": {"v-3f1c0d2a9b7e": 90, "v-0a1b2c3d4e5f": 10}},
                        }
                    },
                },
            ),
        },
        "/v1/functions/{name}/rollback": {
            "parameters": [NAME],
            "post": admin_op(
                "All traffic back to the previous version", "rollback", ok(routing), 404, 409
            ),
        },
        "/v1/functions/{name}/failures": {
            "parameters": [NAME],
            "get": admin_op(
                "Failed requests kept for analysis, newest first",
                "failures",
                ok(
                    {
                        "type": "object",
                        "required": ["name", "failures", "total", "next_offset"],
                        "properties": {
                            "name": {"type": "string"},
                            "failures": {"type": "array", "items": {"type": "object"}},
                            "total": {"type": "integer"},
                            "next_offset": {"type": ["integer", "null"]},
                        },
                    }
                ),
                400,
                404,
                415,
                parameters=[
                    _query("version", {"type": "string"}, "only this version's"),
                    _query(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": 100},
                        "failures per page (default 20)",
                    ),
                    _query(
                        "offset",
                        {"type": "integer", "minimum": 0, "maximum": 2147483648},
                        "where the page starts (the last page's next_offset)",
                    ),
                ],
            ),
        },
    }


def _v1_split() -> dict[str, Schema]:
    """Split inference (docs/edge.md)."""
    k = path_param("k", "split index: 0 is all on the server", {"type": "integer"}, "3")
    point = {
        "type": "object",
        "required": ["name", "dtype", "row_shape", "row_bytes"],
        "properties": {
            "name": {"type": "string"},
            "dtype": {"type": "string"},
            "row_shape": {"type": "array", "items": {"type": "integer"}},
            "row_bytes": {"type": "integer"},
        },
    }
    plan = {
        "type": "object",
        "required": ["function", "version", "points", "splits", "heads", "server_ms"],
        "properties": {
            "function": {"type": "string"},
            "version": {"type": "string"},
            "inputs": {"type": "array", "items": point},
            "outputs": {"type": "array", "items": {"type": "string"}},
            "output_row_bytes": {"type": "integer"},
            "points": {"type": "array", "items": point},
            "splits": {"type": "integer", "description": "len(points) + 2"},
            "heads": {"type": "array", "items": {"type": "object"}},
            "server_ms": {
                "type": "array",
                "items": {"type": "number"},
                "description": "this node's time per segment (segment i: split i to i + 1)",
            },
            "server_wait_ms": {"type": "number", "description": "queue wait expected now"},
        },
    }
    version_query = _query(
        "version", {"type": "string"}, "this version's (default: the one routing picks)"
    )
    return {
        "/v1/functions/{name}/split": {
            "parameters": [NAME],
            "get": {
                "summary": "Split plan data: points, head digests, server time per segment",
                "operationId": "splitPlan",
                "parameters": [version_query],
                "responses": {**ok(plan), **error_responses(401, 404)},
            },
        },
        "/v1/functions/{name}/split/{k}/head": {
            "parameters": [NAME, k],
            "get": {
                "summary": "The head model (ONNX) a device runs for split k",
                "operationId": "splitHead",
                "parameters": [version_query],
                "responses": {
                    "200": {
                        "description": "ONNX bytes; x-fnrt-digest is their sha256",
                        "content": {OCTETS: {"schema": {}}},
                    },
                    **error_responses(400, 401, 404),
                },
            },
        },
        "/v1/functions/{name}/split/{k}": {
            "parameters": [NAME, k],
            "post": {
                "summary": "Run the tail of split k on an activation",
                "description": "A msgpack map {activation: float32|float16 array} or "
                "{activation: int8 array, scale: number}; answers the outputs in msgpack. "
                "x-fnrt-version pins the version the head came from.",
                "operationId": "splitTail",
                "parameters": [
                    *INVOKE_HEADERS,
                    {"name": "x-fnrt-version", "in": "header", "schema": {"type": "string"}},
                ],
                "requestBody": {"required": True, "content": {MSGPACK: {"schema": {}}}},
                "responses": {
                    "200": {
                        "description": "the outputs; x-fnrt-server-ms is the time spent here",
                        "content": {MSGPACK: {"schema": {}}, JSON: {"schema": {}}},
                    },
                    **data_error_responses(400, 401, 404, 413, 415, 422, 429, 500, 503, 504),
                },
            },
        },
        "/v1/probe": {
            "post": {
                "summary": "A bandwidth probe: the body is read and dropped",
                "operationId": "probe",
                "requestBody": {"content": {OCTETS: {"schema": {}}}},
                "responses": {
                    "204": {"description": "read; x-fnrt-server-ms is 0"},
                    **error_responses(400, 413),
                },
            }
        },
    }


def _v1_jobs() -> dict[str, Schema]:
    """Asynchronous jobs (docs/jobs.md)."""
    job_id = path_param(
        "id",
        "job id: 25 hex digits",
        {"type": "string", "pattern": "^[0-9a-f]{25}$"},
        "001a2402" + "0" * 17,
    )
    count = {"type": "integer", "minimum": 0}
    status = {
        "type": "object",
        "required": ["id", "function", "version", "state", "progress", "timings"],
        "properties": {
            "id": {"type": "string"},
            "function": {"type": "string"},
            "version": {"type": "string", "description": "the version that runs every record"},
            "state": {"enum": ["queued", "running", "done", "failed", "cancelled"]},
            "reason": {"type": ["string", "null"]},
            "progress": {
                "type": "object",
                "properties": {
                    k: count
                    for k in (
                        "records_total",
                        "records_done",
                        "records_failed",
                        "chunks_total",
                        "chunks_done",
                    )
                },
            },
            "timings": {"type": "object"},
        },
    }
    record = {
        "type": "object",
        "minProperties": 1,
        "description": "input name -> tensor, as an invoke's body",
    }
    submit = {
        "type": "object",
        # records inline or an object of the store: the server refuses a body with neither
        "anyOf": [{"required": ["records"]}, {"required": ["input"]}],
        "properties": {
            "records": {"type": "array", "items": record, "minItems": 1},
            "input": {
                "type": "string",
                "minLength": 1,
                "description": "a key of the server's store",
            },
            "chunk_records": {"type": "integer", "minimum": 1, "maximum": 100_000},
            "webhook": {"type": "string", "format": "uri"},
            "version": {"type": "string"},
        },
    }
    results = {"schema": {"type": "string"}}
    return {
        "/v1/functions/{name}/jobs": {
            "parameters": [NAME],
            "post": {
                "summary": "Queue a job of records: answered 202 with its id",
                "description": "Records inline ({records: [...]}, JSON or msgpack), an object "
                "of the store ({input: key}), or a record file as the body: "
                "application/x-ndjson, application/vnd.fnrt.records+msgpack or "
                "application/x-npz, with the options as query parameters. Every record is "
                "checked first: a bad one is refused naming its index (and line).",
                "operationId": "submitJob",
                "parameters": [
                    _query("chunk_records", {"type": "integer", "minimum": 1, "maximum": 100_000}),
                    _query("webhook", {"type": "string"}),
                    _query("version", {"type": "string"}),
                ],
                "requestBody": {"required": True, "content": {JSON: {"schema": submit}}},
                "responses": {
                    **ok(status, "queued; Location: /v1/jobs/{id}", "202"),
                    **error_responses(400, 401, 404, 413, 415, 422),
                },
            },
        },
        "/v1/jobs": {
            "get": admin_op(
                "List jobs, oldest first, a page at a time",
                "listJobs",
                ok(
                    {
                        "type": "object",
                        "required": ["jobs", "next"],
                        "properties": {
                            "jobs": {"type": "array", "items": status},
                            "next": {"type": ["string", "null"]},
                        },
                    }
                ),
                400,
                parameters=[
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
                    _query("after", {"type": "string", "pattern": "^[0-9a-f]{25}$"}),
                    _query("function", {"type": "string"}),
                ],
            ),
        },
        "/v1/jobs/{id}": {
            "parameters": [job_id],
            "get": {
                "summary": "A job's state, progress, timings and version",
                "operationId": "getJob",
                "responses": {**ok(status), **error_responses(400, 401, 404)},
            },
            "delete": {
                "summary": "Cancel a job: no chunk starts after this",
                "operationId": "cancelJob",
                "responses": {**ok(status), **error_responses(400, 401, 404, 409)},
            },
        },
        "/v1/jobs/{id}/result": {
            "parameters": [job_id],
            "get": {
                "summary": "One result per record, in input order, once the job has ended",
                "operationId": "jobResult",
                "responses": {
                    "200": {
                        "description": '{"index", "outputs"} or {"index", "error"} per record',
                        "content": {
                            "application/x-ndjson": results,
                            "application/vnd.fnrt.records+msgpack": results,
                            "application/x-npz": results,
                        },
                    },
                    **error_responses(400, 401, 404, 409, 415),
                },
            },
        },
    }


def _v1() -> dict[str, Schema]:
    deployed = {
        "type": "object",
        "required": ["name", "version", "created"],
        "properties": {
            "name": {"type": "string"},
            "version": {"type": "string"},
            "created": {"type": "boolean"},
        },
    }
    summary = {
        "type": "object",
        "required": ["functions", "next_cursor"],
        "properties": {
            "functions": {"type": "array", "items": {"type": "object"}},
            "next_cursor": {"type": ["string", "null"]},
        },
    }
    return {
        "/v1/functions/{name}/invoke": invoke_path(),
        "/v1/functions/{name}/generate": generate_path(),
        "/v1/functions": {
            "get": admin_op(
                "List functions, a page at a time",
                "listFunctions",
                ok(summary),
                400,
                parameters=[
                    _query(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": 1000},
                        "functions per page (default 100)",
                    ),
                    _query(
                        "cursor",
                        {"type": "string", "pattern": NAME_PATTERN.pattern},
                        "list after this function (the last page's next_cursor)",
                    ),
                ],
            ),
            "post": admin_op(
                "Deploy a version (its blobs uploaded first)",
                "deploy",
                {
                    **ok(deployed, "deployed before: same content, same id"),
                    **ok(deployed, "deployed", "201"),
                },
                400,
                404,
                409,
                413,
                422,
                parameters=[
                    _query(
                        "policy",
                        {"type": "string", "enum": ["immediate", "canary"]},
                        "how traffic moves (default: the manifest's rollout.policy)",
                    )
                ],
                requestBody={
                    "required": True,
                    "content": {JSON: {"schema": ref("VersionManifest")}},
                },
            ),
        },
        "/v1/functions/{name}": {
            "parameters": [NAME],
            "get": admin_op("Describe a function", "describe", ok({"type": "object"}), 404),
            "delete": admin_op(
                "Remove a function (its blobs stay)",
                "deleteFunction",
                ok({"type": "object", "properties": {"deleted": {"type": "boolean"}}}),
                404,
            ),
        },
        "/v1/functions/{name}/warm": {
            "parameters": [NAME],
            "post": admin_op("Load now", "warm", ok(FUNCTION_STATE), 404, 500, 503),
        },
        "/v1/functions/{name}/unload": {
            "parameters": [NAME],
            "post": admin_op(
                "Scale to zero now; a batch still running after wait_s is stopped (503)",
                "unload",
                ok({"type": "object"}),
                400,
                404,
                parameters=[
                    _query(
                        "wait_s",
                        {"type": "integer", "minimum": 0, "maximum": 3600},
                        "seconds to wait for running batches (default 10)",
                    )
                ],
            ),
        },
        **_v1_versions(),
        **_v1_split(),
        **_v1_jobs(),
        "/v1/blobs/{digest}": {
            "parameters": [DIGEST],
            "head": admin_op(
                "Is the blob in the store?",
                "hasBlob",
                {"200": {"description": "present"}, "404": {"description": "absent"}},
                400,
            ),
            "put": admin_op(
                "Upload a blob, verified against its digest",
                "putBlob",
                {
                    **ok({"type": "object"}, "already present"),
                    **ok({"type": "object"}, "stored", "201"),
                },
                400,
                503,
                requestBody={"required": True, "content": {OCTETS: {"schema": {}}}},
            ),
        },
        "/healthz": {
            "get": {
                "summary": "Live",
                "operationId": "healthz",
                "responses": ok({"type": "object"}),
            }
        },
        "/readyz": {
            "get": {
                "summary": "Ready: started and the store answers",
                "operationId": "readyz",
                "responses": {
                    **ok({"type": "object"}),
                    "503": {
                        "description": "not ready",
                        "content": {JSON: {"schema": {"type": "object"}}},
                    },
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (text exposition format)",
                "operationId": "metrics",
                "responses": {
                    "200": {
                        "description": "requests, latencies, batches, cold starts, instances",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "operationId": "openapi",
                "responses": ok({"type": "object"}),
            }
        },
        "/docs": {
            "get": {
                "summary": "This document, browsable (Swagger UI)",
                "operationId": "docs",
                "responses": {
                    "200": {
                        "description": "an HTML page that reads /openapi.json",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }


def _components() -> Schema:
    parameters = {"type": "object", "additionalProperties": True}
    infer_input = {
        "type": "object",
        "required": ["name", "shape", "datatype"],
        "properties": {
            "name": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "datatype": {"type": "string", "enum": sorted(DTYPE_OF_DATATYPE)},
            "parameters": parameters,
            "data": {"type": "array", "description": "nested or flat row-major"},
        },
    }
    infer_output = {
        "type": "object",
        "required": ["name", "shape", "datatype"],
        "properties": {
            "name": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}},
            "datatype": {"type": "string"},
            "parameters": parameters,
            "data": {"type": "array"},
        },
    }
    duration = {
        "type": "object",
        "properties": {"count": {"type": "integer"}, "ns": {"type": "integer"}},
    }
    return {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {
                "type": "object",
                "required": ["error"],
                "properties": {"error": {"type": "string"}},
            },
            "VersionManifest": {
                "type": "object",
                "required": ["manifest", "bundle"],
                "properties": {
                    "manifest": {"type": "object"},
                    "bundle": {"type": "object"},
                    "artifacts": {"type": "object"},
                },
                "description": "what `fnrt deploy` sends; dtypes: " + ", ".join(sorted(DTYPES)),
            },
            "InferRequest": {
                "type": "object",
                "required": ["inputs"],
                "properties": {
                    "id": {"type": "string"},
                    "parameters": parameters,
                    "inputs": {"type": "array", "items": infer_input, "minItems": 1},
                    "outputs": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {"name": {"type": "string"}, "parameters": parameters},
                        },
                    },
                },
            },
            "InferResponse": {
                "type": "object",
                "required": ["model_name", "outputs"],
                "properties": {
                    "model_name": {"type": "string"},
                    "model_version": {"type": "string"},
                    "id": {"type": "string"},
                    "outputs": {"type": "array", "items": infer_output},
                },
            },
            "ModelMetadata": {
                "type": "object",
                "required": ["name", "platform", "inputs", "outputs"],
                "properties": {
                    "name": {"type": "string"},
                    "versions": {"type": "array", "items": {"type": "string"}},
                    "platform": {"type": "string"},
                    "inputs": {"type": "array", "items": tensor_metadata()},
                    "outputs": {"type": "array", "items": tensor_metadata()},
                },
            },
            "ModelStats": {
                "type": "object",
                "required": ["model_stats"],
                "properties": {
                    "model_stats": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string"},
                                "version": {"type": "string"},
                                "inference_count": {"type": "integer"},
                                "execution_count": {"type": "integer"},
                                "inference_stats": {
                                    "type": "object",
                                    "additionalProperties": duration,
                                },
                                "batch_stats": {"type": "array", "items": {"type": "object"}},
                            },
                        },
                    }
                },
            },
        },
    }


def document(functions: Mapping[str, Manifest] | None = None) -> Schema:
    """The OpenAPI document (a fresh dict each call), with an invoke path of its own for
    each of ``functions`` (name -> the manifest of the version it routes to)."""
    served = {
        f"/v1/functions/{name}/invoke": function_invoke_path(manifest)
        for name, manifest in sorted((functions or {}).items())
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "fnrt",
            "version": server_version(),
            "description": "Invoke functions (/v1), the Open Inference Protocol (/v2), admin.",
        },
        "paths": {**_v1(), **served, **v2_paths()},
        "components": _components(),
    }


def function_invoke_path(manifest: Manifest) -> Schema:
    """``POST /v1/functions/NAME/invoke`` with the schemas of NAME's inputs and outputs."""
    inputs = {name: tensor_schema(spec) for name, spec in manifest.inputs.items()}
    outputs = {name: tensor_schema(spec) for name, spec in manifest.outputs.items()}
    request: Schema = {"type": "object", "properties": inputs, "required": sorted(inputs)}
    if inputs:
        request["additionalProperties"] = False
    answer: Schema = {"type": "object", "properties": outputs, "required": sorted(outputs)}
    return {
        "post": {
            "summary": f"Invoke {manifest.name}",
            "description": manifest.description or f"The inputs and outputs of {manifest.name}.",
            "operationId": f"invoke_{manifest.name.replace('-', '_')}",
            "tags": ["functions"],
            "parameters": list(INVOKE_HEADERS),
            "requestBody": {
                "required": True,
                # msgpack: the same map (arrays as nested lists, or msgpack_numpy's maps)
                "content": {JSON: {"schema": request}, MSGPACK: {"schema": request}},
            },
            "responses": {
                "200": {
                    "description": "the outputs; x-fnrt-version says which version served",
                    "content": {JSON: {"schema": answer}, MSGPACK: {"schema": {}}},
                },
                **data_error_responses(400, 401, 404, 413, 415, 422, 429, 500, 503, 504),
            },
        }
    }


def tensor_schema(spec: TensorSpec) -> Schema:
    """The JSON form of a tensor: nested arrays as deep as its shape (fixed dimensions as
    item counts), elements bounded by its dtype. A free dimension (-1) with dimensions
    inside it holds at least one item: an empty list has no inner shape to match (``[]``
    for ``[-1, 64]`` is shape ``[0]``, which the server refuses, 422)."""
    schema = _element(spec.dtype)
    for depth, dim in reversed(list(enumerate(spec.shape))):
        level: Schema = {"type": "array", "items": schema}
        if dim >= 0:
            level["minItems"] = level["maxItems"] = dim
        elif depth < len(spec.shape) - 1:
            level["minItems"] = 1
        schema = level
    return schema


def _element(dtype: str) -> Schema:
    if dtype == "bytes":
        return {"type": "string"}
    if dtype == "bool":
        return {"type": "boolean"}
    if dtype == "bfloat16":
        return {
            "type": "number",
            "minimum": -3.3895313892515355e38,
            "maximum": 3.3895313892515355e38,
        }
    kind: Any = np.dtype(dtype)
    if kind.kind == "f":
        if kind.itemsize >= 8:
            return {"type": "number"}
        largest = float(np.finfo(kind).max)
        return {"type": "number", "minimum": -largest, "maximum": largest}
    bounds = np.iinfo(kind)
    return {"type": "integer", "minimum": int(bounds.min), "maximum": int(bounds.max)}


async def openapi_json(request: Request) -> Response:
    """The document, with an invoke path for each function the caller may call (one with
    invoke keys only for a caller with one: its schema is what its model routes hide)."""
    node = request.app.state.node
    keys, headers = node.invoke_keys, request.headers
    served = {
        entry.name: entry.primary.version.manifest
        for entry in node.registry.entries()
        if allows(keys, entry.name, headers)
    }
    return JSONResponse(document(served))


#: Swagger UI from its CDN (the browser fetches it; the server holds no assets).
_DOCS_PAGE = """<!doctype html>
<html>
<head>
<meta charset="utf-8">
<title>fnrt API</title>
<link rel="stylesheet" href="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js"></script>
<script>SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui"});</script>
</body>
</html>
"""


async def docs_page(request: Request) -> Response:
    return HTMLResponse(_DOCS_PAGE)


routes = [
    Route("/openapi.json", openapi_json, methods=["GET"]),
    Route("/docs", docs_page, methods=["GET"]),
]
