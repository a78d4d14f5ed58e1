"""The OpenAPI 3.1 document of the whole HTTP API, served at ``GET /openapi.json``.

Written by hand from the routes (``tests/runtime/http/test_openapi.py`` checks
that every route is here and nothing else is, and schemathesis checks the
server against it).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fnrt.functions.dtypes import DTYPE_OF_DATATYPE, DTYPES
from fnrt.runtime.http.state import server_version

JSON = "application/json"
MSGPACK = "application/msgpack"
OCTETS = "application/octet-stream"

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _error(description: str) -> Schema:
    return {"description": description, "content": {JSON: {"schema": _ref("Error")}}}


_ERRORS = {
    "400": "malformed body, header or parameter",
    "401": "admin route without the right bearer token",
    "404": "no such function, version or blob",
    "409": "a conditional write lost a race",
    "413": "body over the server's limit",
    "415": "unsupported Content-Type, Accept or Content-Encoding",
    "422": "inputs or manifest that do not match what is declared",
    "429": "queue full: retry after Retry-After seconds",
    "500": "the handler raised or broke its contract (error_id is in the server log)",
    "503": "shutting down, store unreachable, or cannot finish within the target",
    "504": "the request's deadline passed while it was queued",
}


def _errors(*codes: int) -> dict[str, Schema]:
    return {str(c): _error(_ERRORS[str(c)]) for c in codes}


def _ok(schema: Schema, description: str = "OK", status: str = "200") -> dict[str, Schema]:
    return {status: {"description": description, "content": {JSON: {"schema": schema}}}}


def _path_param(name: str, description: str, schema: Schema, example: str) -> Schema:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": schema,
        "example": example,
    }


_NAME = _path_param("name", "function (model) name", {"type": "string", "minLength": 1}, "mlp")
_VERSION = _path_param("version", "version id", {"type": "string"}, "v-3f1c0d2a9b7e")
_DIGEST = _path_param("digest", "sha256 of the blob, 64 hex digits", {"type": "string"}, "0" * 64)

#: The README's ``mlp`` example: x float32 [n, 64] -> y float32 [n, 10].
_X = [[round(i / 64, 3) for i in range(64)]]
_INFER_EXAMPLE = {
    "id": "42",
    "inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": _X[0]}],
    "outputs": [{"name": "y"}],
}
_ADMIN: list[dict[str, list[str]]] = [
    {"bearer": []},
    {},
]  # a bearer token when the server has --admin-token

_INVOKE_HEADERS = [
    {
        "name": "x-fnrt-priority",
        "in": "header",
        "schema": {"type": "string", "enum": ["high", "normal", "low"]},
        "description": "served before (or after) other requests; aging prevents starvation",
    },
    {
        "name": "x-fnrt-timeout-ms",
        "in": "header",
        "schema": {"type": "number", "exclusiveMinimum": 0},
        "description": "drop the request (504) if it has not started computing in time",
    },
]


def _invoke() -> Schema:
    tensors = {"type": "object", "additionalProperties": True}
    return {
        "post": {
            "summary": "Invoke a function",
            "description": "A map of input name to tensor: nested lists in JSON, "
            "msgpack_numpy arrays in msgpack. Answers in the request's format or Accept's.",
            "operationId": "invoke",
            "parameters": [_NAME, *_INVOKE_HEADERS],
            "requestBody": {
                "required": True,
                "content": {
                    JSON: {"schema": tensors, "example": {"x": _X}},
                    MSGPACK: {"schema": {}},
                },
            },
            "responses": {
                "200": {
                    "description": "the outputs; x-fnrt-version says which version served",
                    "content": {JSON: {"schema": tensors}, MSGPACK: {"schema": {}}},
                },
                **_errors(400, 404, 413, 415, 422, 429, 500, 503, 504),
            },
        }
    }


def _admin_op(
    summary: str, operation_id: str, ok: dict[str, Schema], *errors: int, **extra: Any
) -> Schema:
    return {
        "summary": summary,
        "operationId": operation_id,
        "security": _ADMIN,
        "responses": {**ok, **_errors(401, *errors)},
        **extra,
    }


_FUNCTION_STATE = {
    "type": "object",
    "required": ["name", "version", "state"],
    "properties": {
        "name": {"type": "string"},
        "version": {"type": "string"},
        "state": {"type": "string", "enum": ["cold", "loading", "warm"]},
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
        "properties": {"functions": {"type": "array", "items": {"type": "object"}}},
    }
    return {
        "/v1/functions/{name}/invoke": _invoke(),
        "/v1/functions": {
            "get": _admin_op("List functions", "listFunctions", _ok(summary)),
            "post": _admin_op(
                "Deploy a version (its blobs uploaded first)",
                "deploy",
                {
                    **_ok(deployed, "deployed before: same content, same id"),
                    **_ok(deployed, "deployed", "201"),
                },
                400,
                404,
                413,
                422,
                requestBody={
                    "required": True,
                    "content": {JSON: {"schema": _ref("VersionManifest")}},
                },
            ),
        },
        "/v1/functions/{name}": {
            "parameters": [_NAME],
            "get": _admin_op("Describe a function", "describe", _ok({"type": "object"}), 404),
            "delete": _admin_op(
                "Remove a function (its blobs stay)",
                "deleteFunction",
                _ok({"type": "object", "properties": {"deleted": {"type": "boolean"}}}),
                404,
            ),
        },
        "/v1/functions/{name}/warm": {
            "parameters": [_NAME],
            "post": _admin_op("Load now", "warm", _ok(_FUNCTION_STATE), 404, 500, 503),
        },
        "/v1/functions/{name}/unload": {
            "parameters": [_NAME],
            "post": _admin_op(
                "Scale to zero now (when idle)", "unload", _ok({"type": "object"}), 404
            ),
        },
        "/v1/blobs/{digest}": {
            "parameters": [_DIGEST],
            "head": _admin_op(
                "Is the blob in the store?",
                "hasBlob",
                {"200": {"description": "present"}, "404": {"description": "absent"}},
                400,
            ),
            "put": _admin_op(
                "Upload a blob, verified against its digest",
                "putBlob",
                {
                    **_ok({"type": "object"}, "already present"),
                    **_ok({"type": "object"}, "stored", "201"),
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
                "responses": _ok({"type": "object"}),
            }
        },
        "/readyz": {
            "get": {
                "summary": "Ready: started and the store answers",
                "operationId": "readyz",
                "responses": {
                    **_ok({"type": "object"}),
                    "503": {
                        "description": "not ready",
                        "content": {JSON: {"schema": {"type": "object"}}},
                    },
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "operationId": "openapi",
                "responses": _ok({"type": "object"}),
            }
        },
    }


def _tensor_metadata() -> Schema:
    return {
        "type": "object",
        "required": ["name", "datatype", "shape"],
        "properties": {
            "name": {"type": "string"},
            "datatype": {"type": "string", "enum": sorted(DTYPE_OF_DATATYPE)},
            "shape": {"type": "array", "items": {"type": "integer"}},
        },
    }


def _v2_model_paths(base: str, params: list[Schema], suffix_id: str) -> dict[str, Schema]:
    infer_body = {
        "required": True,
        "description": "JSON, or (with Inference-Header-Content-Length) JSON then raw tensors",
        "content": {
            JSON: {"schema": _ref("InferRequest"), "example": _INFER_EXAMPLE},
            OCTETS: {"schema": {}},
        },
    }
    infer_headers = [
        {
            "name": "inference-header-content-length",
            "in": "header",
            "schema": {"type": "integer", "minimum": 0},
            "description": "length of the JSON header when binary tensors follow it",
        },
        {
            "name": "content-encoding",
            "in": "header",
            "schema": {"type": "string", "enum": ["gzip", "deflate", "identity"]},
        },
        {
            "name": "accept-encoding",
            "in": "header",
            "schema": {"type": "string"},
            "description": "gzip or deflate compresses the response; other codings are ignored",
        },
        *_INVOKE_HEADERS,
    ]
    ready = {
        "type": "object",
        "required": ["name", "ready"],
        "properties": {
            "name": {"type": "string"},
            "version": {"type": "string"},
            "ready": {"type": "boolean"},
        },
    }
    return {
        base: {
            "parameters": params,
            "get": {
                "summary": "Model metadata",
                "operationId": f"modelMetadata{suffix_id}",
                "responses": {**_ok(_ref("ModelMetadata")), **_errors(404)},
            },
        },
        f"{base}/ready": {
            "parameters": params,
            "get": {
                "summary": "Model readiness (deployed, last load did not fail)",
                "operationId": f"modelReady{suffix_id}",
                "responses": {
                    **_ok(ready),
                    "503": {
                        "description": "its last load failed",
                        "content": {JSON: {"schema": ready}},
                    },
                    **_errors(404),
                },
            },
        },
        f"{base}/config": {
            "parameters": params,
            "get": {
                "summary": "Model configuration in Triton's shape",
                "operationId": f"modelConfig{suffix_id}",
                "responses": {**_ok({"type": "object"}), **_errors(404)},
            },
        },
        f"{base}/stats": {
            "parameters": params,
            "get": {
                "summary": "Model statistics in Triton's shape (this node's counters)",
                "operationId": f"modelStats{suffix_id}",
                "responses": {**_ok(_ref("ModelStats")), **_errors(404)},
            },
        },
        f"{base}/infer": {
            "parameters": params,
            "post": {
                "summary": "Inference (the same scheduler and batching as /v1 invokes)",
                "operationId": f"infer{suffix_id}",
                "parameters": infer_headers,
                "requestBody": infer_body,
                "responses": {
                    "200": {
                        "description": "JSON, or JSON then binary outputs "
                        "(Inference-Header-Content-Length)",
                        "content": {
                            JSON: {"schema": _ref("InferResponse")},
                            OCTETS: {"schema": {}},
                        },
                    },
                    **_errors(400, 404, 413, 415, 422, 429, 500, 503, 504),
                },
            },
        },
    }


def _v2() -> dict[str, Schema]:
    control = {
        "required": False,
        "content": {JSON: {"schema": {"type": "object"}}},
    }
    index_entry = {
        "type": "object",
        "required": ["name", "state"],
        "properties": {
            "name": {"type": "string"},
            "version": {"type": "string"},
            "state": {"type": "string"},
            "reason": {"type": "string"},
        },
    }
    return {
        "/v2/health/live": {
            "get": {
                "summary": "Server live",
                "operationId": "serverLive",
                "responses": _ok({"type": "object", "properties": {"live": {"type": "boolean"}}}),
            }
        },
        "/v2/health/ready": {
            "get": {
                "summary": "Server ready",
                "operationId": "serverReady",
                "responses": {
                    **_ok({"type": "object", "properties": {"ready": {"type": "boolean"}}}),
                    "503": {
                        "description": "not ready",
                        "content": {JSON: {"schema": {"type": "object"}}},
                    },
                },
            }
        },
        "/v2": {
            "get": {
                "summary": "Server metadata",
                "operationId": "serverMetadata",
                "responses": _ok(
                    {
                        "type": "object",
                        "required": ["name", "version", "extensions"],
                        "properties": {
                            "name": {"type": "string"},
                            "version": {"type": "string"},
                            "extensions": {"type": "array", "items": {"type": "string"}},
                        },
                    }
                ),
            }
        },
        "/v2/models/stats": {
            "get": {
                "summary": "Statistics of every model version this node serves",
                "operationId": "allModelStats",
                "responses": _ok(_ref("ModelStats")),
            }
        },
        **_v2_model_paths("/v2/models/{name}", [_NAME], ""),
        **_v2_model_paths("/v2/models/{name}/versions/{version}", [_NAME, _VERSION], "Version"),
        "/v2/repository/index": {
            "post": _admin_op(
                "Model repository index",
                "repositoryIndex",
                _ok({"type": "array", "items": index_entry}),
                400,
                413,
                requestBody=control,
            )
        },
        "/v2/repository/models/{name}/load": {
            "parameters": [_NAME],
            "post": _admin_op(
                "Load (warm) a model now",
                "repositoryLoad",
                _ok(_FUNCTION_STATE),
                400,
                404,
                413,
                500,
                503,
                requestBody=control,
            ),
        },
        "/v2/repository/models/{name}/unload": {
            "parameters": [_NAME],
            "post": _admin_op(
                "Unload (scale to zero) a model now",
                "repositoryUnload",
                _ok(_FUNCTION_STATE),
                400,
                404,
                413,
                requestBody=control,
            ),
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
                    "inputs": {"type": "array", "items": infer_input},
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
                    "inputs": {"type": "array", "items": _tensor_metadata()},
                    "outputs": {"type": "array", "items": _tensor_metadata()},
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


def document() -> Schema:
    """The OpenAPI document (a fresh dict each call)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "fnrt",
            "version": server_version(),
            "description": "Invoke functions (/v1), the Open Inference Protocol (/v2), admin.",
        },
        "paths": {**_v1(), **_v2()},
        "components": _components(),
    }


async def openapi_json(request: Request) -> Response:
    return JSONResponse(document())


routes = [Route("/openapi.json", openapi_json, methods=["GET"])]
