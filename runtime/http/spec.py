"""Building blocks of the OpenAPI document: media types, responses, parameters."""

from __future__ import annotations

from typing import Any

JSON = "application/json"
MSGPACK = "application/msgpack"
OCTETS = "application/octet-stream"

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def error_response(description: str) -> Schema:
    return {"description": description, "content": {JSON: {"schema": ref("Error")}}}


ERROR_TEXTS = {
    "400": "malformed body, header or parameter",
    "401": "admin route without the right bearer token",
    "404": "no such function, version or blob",
    "409": "a conditional write lost a race, or no earlier version to roll back to",
    "413": "body over the server's limit",
    "415": "unsupported Content-Type, Accept or Content-Encoding",
    "422": "inputs or manifest that do not match what is declared, or a new version that "
    "failed to load, warm up or pass its probe",
    "429": "queue full: retry after Retry-After seconds",
    "500": "the handler raised or broke its contract (error_id is in the server log)",
    "503": "shutting down, store unreachable, cannot finish within the target, "
    "or the version's circuit breaker is open and there is no fallback",
    "504": "the request's deadline passed while it was queued",
}


def error_responses(*codes: int) -> dict[str, Schema]:
    return {str(c): error_response(ERROR_TEXTS[str(c)]) for c in codes}


def data_error_responses(*codes: int) -> dict[str, Schema]:
    """Errors of the data routes: in the request's format, JSON or msgpack."""
    out = error_responses(*codes)
    for response in out.values():
        response["content"][MSGPACK] = {"schema": ref("Error")}
    return out


def ok(schema: Schema, description: str = "OK", status: str = "200") -> dict[str, Schema]:
    return {status: {"description": description, "content": {JSON: {"schema": schema}}}}


def path_param(name: str, description: str, schema: Schema, example: str) -> Schema:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": schema,
        "example": example,
    }


NAME = path_param("name", "function (model) name", {"type": "string", "minLength": 1}, "mlp")
VERSION = path_param("version", "version id", {"type": "string"}, "v-3f1c0d2a9b7e")
DIGEST = path_param("digest", "sha256 of the blob, 64 hex digits", {"type": "string"}, "0" * 64)

#: The README's ``mlp`` example: x float32 [n, 64] -> y float32 [n, 10].
X_EXAMPLE = [[round(i / 64, 3) for i in range(64)]]
INFER_EXAMPLE = {
    "id": "42",
    "inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": X_EXAMPLE[0]}],
    "outputs": [{"name": "y"}],
}
ADMIN: list[dict[str, list[str]]] = [
    {"bearer": []},
    {},
]  # a bearer token when the server has --admin-token

INVOKE_HEADERS = [
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
    {
        "name": "x-fnrt-version",
        "in": "header",
        "schema": {"type": "string"},
        "description": "answer with this stored version, whatever the traffic split (404 if none)",
    },
    {
        "name": "x-fnrt-sticky",
        "in": "header",
        "schema": {"type": "string"},
        "description": "during a traffic split, the same key is always served by the same version",
    },
]


def invoke_path() -> Schema:
    tensors = {"type": "object", "additionalProperties": True}
    inputs = {**tensors, "minProperties": 1}  # every function takes an input at least
    return {
        "post": {
            "summary": "Invoke a function",
            "description": "A map of input name to tensor: nested lists in JSON, "
            "msgpack_numpy arrays in msgpack. Answers in the request's format or Accept's.",
            "operationId": "invoke",
            "parameters": [NAME, *INVOKE_HEADERS],
            "requestBody": {
                "required": True,
                "content": {
                    JSON: {"schema": inputs, "example": {"x": X_EXAMPLE}},
                    MSGPACK: {"schema": {}},
                },
            },
            "responses": {
                "200": {
                    "description": "the outputs; x-fnrt-version says which version served",
                    "content": {JSON: {"schema": tensors}, MSGPACK: {"schema": {}}},
                },
                **data_error_responses(400, 404, 413, 415, 422, 429, 500, 503, 504),
            },
        }
    }


def generate_path() -> Schema:
    """``POST /v1/functions/{name}/generate`` (docs/generation.md)."""
    body = {
        "type": "object",
        "properties": {
            "parameters": {
                "type": "object",
                "description": "max_new_tokens, stream, and what the function declares",
                "properties": {
                    "max_new_tokens": {"type": "integer", "minimum": 1},
                    "stream": {"type": "boolean"},
                },
                "additionalProperties": True,
            }
        },
        "additionalProperties": True,
    }
    whole = {
        "type": "object",
        "required": ["outputs"],
        "properties": {
            "outputs": {"type": "object", "additionalProperties": True},
            "finish_reason": {
                "type": "string",
                "enum": ["stop", "length", "deadline", "cancelled"],
            },
            "usage": {"type": "object"},
        },
    }
    return {
        "post": {
            "summary": "Generate: a generative function's answer, streamed or whole",
            "description": "The inputs, as for an invoke, and optional parameters. Streams "
            "(Server-Sent Events for JSON, msgpack frames for msgpack) when "
            "parameters.stream is true or Accept asks for a stream.",
            "operationId": "generate",
            "parameters": [NAME, *INVOKE_HEADERS],
            "requestBody": {
                "required": True,
                "content": {JSON: {"schema": body}, MSGPACK: {"schema": {}}},
            },
            "responses": {
                "200": {
                    "description": "the whole result, or the stream of its chunks",
                    "content": {
                        JSON: {"schema": whole},
                        MSGPACK: {"schema": {}},
                        "text/event-stream": {"schema": {"type": "string"}},
                        "application/vnd.fnrt.frames+msgpack": {"schema": {}},
                    },
                },
                **data_error_responses(400, 404, 413, 415, 422, 429, 500, 503, 504),
            },
        }
    }


def admin_op(
    summary: str, operation_id: str, ok: dict[str, Schema], *errors: int, **extra: Any
) -> Schema:
    return {
        "summary": summary,
        "operationId": operation_id,
        "security": ADMIN,
        "responses": {**ok, **error_responses(401, *errors)},
        **extra,
    }


FUNCTION_STATE = {
    "type": "object",
    "required": ["name", "version", "state"],
    "properties": {
        "name": {"type": "string"},
        "version": {"type": "string"},
        "state": {"type": "string", "enum": ["cold", "loading", "warm"]},
    },
}
