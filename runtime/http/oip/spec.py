"""The Open Inference Protocol's part of the OpenAPI document (``/v2``)."""

from __future__ import annotations

from fnrt.functions.dtypes import DTYPE_OF_DATATYPE
from fnrt.runtime.http.spec import (
    FUNCTION_STATE,
    INFER_EXAMPLE,
    INVOKE_HEADERS,
    JSON,
    NAME,
    OCTETS,
    VERSION,
    Schema,
    admin_op,
    error_responses,
    ok,
    ref,
)


def tensor_metadata() -> Schema:
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
            JSON: {"schema": ref("InferRequest"), "example": INFER_EXAMPLE},
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
        *INVOKE_HEADERS,
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
                "responses": {**ok(ref("ModelMetadata")), **error_responses(401, 404)},
            },
        },
        f"{base}/ready": {
            "parameters": params,
            "get": {
                "summary": "Model readiness (deployed, last load did not fail)",
                "operationId": f"modelReady{suffix_id}",
                "responses": {
                    **ok(ready),
                    "503": {
                        "description": "its last load failed",
                        "content": {JSON: {"schema": ready}},
                    },
                    **error_responses(401, 404),
                },
            },
        },
        f"{base}/config": {
            "parameters": params,
            "get": {
                "summary": "Model configuration in Triton's shape",
                "operationId": f"modelConfig{suffix_id}",
                "responses": {**ok({"type": "object"}), **error_responses(401, 404)},
            },
        },
        f"{base}/stats": {
            "parameters": params,
            "get": {
                "summary": "Model statistics in Triton's shape (this node's counters)",
                "operationId": f"modelStats{suffix_id}",
                "responses": {**ok(ref("ModelStats")), **error_responses(401, 404)},
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
                            JSON: {"schema": ref("InferResponse")},
                            OCTETS: {"schema": {}},
                        },
                    },
                    **error_responses(400, 401, 404, 413, 415, 422, 429, 500, 503, 504),
                },
            },
        },
        **{
            f"{base}/{kind}": {
                "parameters": params,
                "post": {
                    "summary": summary,
                    "description": "Triton's generate extension, for a generative function "
                    "(docs/generation.md): inputs by name, an optional id, other keys and "
                    "'parameters' as parameters.",
                    "operationId": f"{kind.replace('_s', 'S')}{suffix_id}",
                    "requestBody": {
                        "required": True,
                        "content": {JSON: {"schema": {"type": "object"}}},
                    },
                    "responses": {
                        "200": {"description": answer, "content": {media: {"schema": schema}}},
                        **error_responses(400, 401, 404, 413, 415, 422, 429, 500, 503, 504),
                    },
                },
            }
            for kind, summary, answer, media, schema in (
                (
                    "generate",
                    "Generate: the whole answer",
                    "one response object",
                    JSON,
                    {"type": "object"},
                ),
                (
                    "generate_stream",
                    "Generate: streamed",
                    "SSE data: response objects",
                    "text/event-stream",
                    {"type": "string"},
                ),
            )
        },
    }


def paths() -> dict[str, Schema]:
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
                "responses": ok({"type": "object", "properties": {"live": {"type": "boolean"}}}),
            }
        },
        "/v2/health/ready": {
            "get": {
                "summary": "Server ready",
                "operationId": "serverReady",
                "responses": {
                    **ok({"type": "object", "properties": {"ready": {"type": "boolean"}}}),
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
                "responses": ok(
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
                "responses": ok(ref("ModelStats")),
            }
        },
        **_v2_model_paths("/v2/models/{name}", [NAME], ""),
        **_v2_model_paths("/v2/models/{name}/versions/{version}", [NAME, VERSION], "Version"),
        "/v2/repository/index": {
            "post": admin_op(
                "Model repository index",
                "repositoryIndex",
                ok({"type": "array", "items": index_entry}),
                400,
                413,
                requestBody=control,
            )
        },
        "/v2/repository/models/{name}/load": {
            "parameters": [NAME],
            "post": admin_op(
                "Load (warm) a model now",
                "repositoryLoad",
                ok(FUNCTION_STATE),
                400,
                404,
                413,
                500,
                503,
                requestBody=control,
            ),
        },
        "/v2/repository/models/{name}/unload": {
            "parameters": [NAME],
            "post": admin_op(
                "Unload (scale to zero) a model now",
                "repositoryUnload",
                ok(FUNCTION_STATE),
                400,
                404,
                413,
                requestBody=control,
            ),
        },
    }
