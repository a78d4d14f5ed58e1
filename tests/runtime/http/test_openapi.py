"""``/openapi.json`` names every route the server has, and the server lives up to it.

The route check keeps the document in step with the code; schemathesis then
sends requests generated from the document (valid and not) to a real server
and checks that none gets a 5xx, every status and content type is documented,
and every documented response body matches its schema.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from starlette.routing import Route

from fnrt.runtime.http.app import build_app
from fnrt.runtime.http.invoke import INVOKE_PATH
from fnrt.runtime.http.oip.infer import INFER_PATH
from fnrt.runtime.http.openapi import document
from fnrt.runtime.http.split import SPLIT_PATH
from fnrt.runtime.settings import ServerSettings
from support import live_server, write_function

#: Routes answered as raw ASGI ahead of Starlette's router, with the paths they match.
RAW_ROUTES = {
    ("POST", "/v1/functions/{name}/invoke"): INVOKE_PATH,
    ("POST", "/v2/models/{name}/infer"): INFER_PATH,
    ("POST", "/v2/models/{name}/versions/{version}/infer"): INFER_PATH,
    ("POST", "/v1/functions/{name}/split/{k}"): SPLIT_PATH,
}


def _app_routes(tmp_path: Path) -> set[tuple[str, str]]:
    app = build_app(ServerSettings(store=str(tmp_path / "store"), cache_dir=tmp_path / "cache"))
    found = set()
    for route in app.routes:
        assert isinstance(route, Route)
        methods = route.methods or set()
        for method in methods:
            if method != "HEAD" or "GET" not in methods:  # Starlette adds HEAD to every GET
                found.add((method, route.path))
    return found


def test_document_and_routes_agree(tmp_path: Path) -> None:
    documented = {
        (method.upper(), path)
        for path, item in document()["paths"].items()
        for method in item
        if method != "parameters"
    }
    assert documented == _app_routes(tmp_path)


def test_raw_routes_match_their_documented_paths() -> None:
    for (_, path), pattern in RAW_ROUTES.items():
        concrete = re.sub(r"\{\w+\}", "abc", path)
        assert pattern.fullmatch(concrete), path


HALF = """
class Half:
    def __call__(self, batch):
        return [{"y": r["x"][:, :10] / 2} for r in batch]
"""

#: The document's examples use the README's ``mlp``: x float32 [n, 64] -> y float32 [n, 10].
MLP_MANIFEST = """
name = "{name}"
handler = "handler:Half"

[inputs]
x = {{ dtype = "float32", shape = [-1, 64] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 10] }}
"""


def schemathesis_run(
    url: str, *selection: str, config: Path | None = None
) -> subprocess.CompletedProcess[str]:
    config = config or Path(__file__).parent / "schemathesis.toml"
    argv = [str(Path(sys.executable).parent / "st"), "--config-file", str(config)]
    argv += ["run", f"{url}/openapi.json", "--checks", "all"]
    argv += ["--max-examples", "10", "--seed", "1", "--workers", "1", *selection]
    env = os.environ | {
        "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
        "PYTHONPATH": str(Path(__file__).parent),
        "NO_COLOR": "1",
    }
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)


def test_the_server_lives_up_to_its_document(tmp_path: Path) -> None:
    """schemathesis's every phase (examples, coverage, fuzzing, stateful) and check.

    ``positive_data_acceptance`` is on, with the 4xx a schema-valid request may rightly
    get (``schemathesis.toml``: validity here is more than a JSON schema says). Deletes
    run last, so the other operations find the function there.
    """
    folder = write_function(tmp_path / "src", "mlp", HALF, MLP_MANIFEST)
    with live_server(tmp_path, max_body_bytes=1 << 20) as srv:
        srv.deploy(folder)
        for selection in (["--exclude-method", "DELETE"], ["--include-method", "DELETE"]):
            done = schemathesis_run(srv.url, *selection)
            assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
            assert " passed" in done.stdout and "failed" not in done.stdout
        with srv.client() as c:  # and it still serves
            assert c.get("/healthz").status_code == 200


def test_tensor_schemas_follow_the_declared_dtype_and_shape() -> None:
    from fnrt.functions.manifest import TensorSpec
    from fnrt.runtime.http.openapi import tensor_schema

    x = tensor_schema(TensorSpec("float32", (-1, 4)))
    # the batch: any length but 0 (an empty list has no rows of 4 to match)
    assert x["type"] == "array" and x["minItems"] == 1 and "maxItems" not in x
    row = x["items"]
    assert (row["minItems"], row["maxItems"], row["items"]["type"]) == (4, 4, "number")
    assert row["items"]["maximum"] == float(np.finfo(np.float32).max)
    assert tensor_schema(TensorSpec("uint8", (-1,)))["items"] == {
        "type": "integer",
        "minimum": 0,
        "maximum": 255,
    }
    assert tensor_schema(TensorSpec("bytes", (-1,)))["items"] == {"type": "string"}
    assert tensor_schema(TensorSpec("bool", ()))["type"] == "boolean"
    assert tensor_schema(TensorSpec("float64", (-1,)))["items"] == {"type": "number"}


def test_each_served_function_has_its_own_schemas_and_docs_page(tmp_path: Path) -> None:
    import jsonschema

    folder = write_function(tmp_path / "src", "mlp", HALF, MLP_MANIFEST)
    with live_server(tmp_path) as srv, srv.client() as c:
        srv.deploy(folder)
        doc = c.get("/openapi.json").json()
        post = doc["paths"]["/v1/functions/mlp/invoke"]["post"]
        request = post["requestBody"]["content"]["application/json"]["schema"]
        answer = post["responses"]["200"]["content"]["application/json"]["schema"]
        assert request["required"] == ["x"] and answer["required"] == ["y"]
        body = {"x": [[0.5] * 64, [1.0] * 64]}
        jsonschema.validate(body, request)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"x": [[0.5] * 63]}, request)  # the server's 422, said up front
        r = c.post("/v1/functions/mlp/invoke", json=body)
        assert r.status_code == 200
        jsonschema.validate(r.json(), answer)
        assert c.post("/v1/functions/mlp/invoke", json={"x": [[0.5] * 63]}).status_code == 422
        page = c.get("/docs")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert 'url: "/openapi.json"' in page.text and "swagger-ui" in page.text


def test_a_served_functions_document_says_all_it_accepts(tmp_path: Path) -> None:
    """Every request schemathesis makes from ``invoke_mlp``'s schemas as valid is served
    (2xx), or refused only for what no schema can say: a pinned version that is not
    stored (404), a body past the server's limit (413). Before, it allowed ``{"x": []}``
    (422), any msgpack body (400) and ``x-fnrt-timeout-ms: 5e-324`` (400)."""
    strict = tmp_path / "strict.toml"
    strict.write_text(
        '[checks.positive_data_acceptance]\nexpected-statuses = ["2xx", "404", "413"]\n'
    )
    folder = write_function(tmp_path / "src", "mlp", HALF, MLP_MANIFEST)
    with live_server(tmp_path, max_body_bytes=1 << 20) as srv:
        srv.deploy(folder)
        done = schemathesis_run(srv.url, "--include-operation-id", "invoke_mlp", config=strict)
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
        assert " passed" in done.stdout and "failed" not in done.stdout


def test_the_document_and_the_server_agree_on_deadlines_and_empty_inputs(tmp_path: Path) -> None:
    """What the generic schemas allow, the server takes (a deadline it cannot keep is a
    504, not a 400), and what they refuse, it refuses: deadlines that are not > 0, no
    inputs, an OIP request without tensors, a job without records."""
    import jsonschema

    folder = write_function(tmp_path / "src", "mlp", HALF, MLP_MANIFEST)
    body = {"x": [[0.5] * 64]}
    with live_server(tmp_path) as srv, srv.client() as c:
        srv.deploy(folder)
        doc = c.get("/openapi.json").json()
        invoke = doc["paths"]["/v1/functions/{name}/invoke"]["post"]
        (header,) = [p for p in invoke["parameters"] if p["name"] == "x-fnrt-timeout-ms"]
        for ms in (-1.0, 0.0, 5e-324, 1e-300, 0.25, 1.0, 1000.0, 1e300):
            r = c.post("/v1/functions/mlp/invoke", json=body, headers={header["name"]: repr(ms)})
            valid = jsonschema.Draft202012Validator(header["schema"]).is_valid(ms)
            assert (r.status_code != 400) == valid, (ms, r.status_code, r.text)
            assert r.status_code in ((200, 504) if valid else (400,)), (ms, r.status_code)
        generic = invoke["requestBody"]["content"]["application/json"]["schema"]
        infer = doc["components"]["schemas"]["InferRequest"]
        submit = doc["paths"]["/v1/functions/{name}/jobs"]["post"]["requestBody"]
        submit = submit["content"]["application/json"]["schema"]
        refused = [
            ("/v1/functions/mlp/invoke", generic, {}),
            ("/v2/models/mlp/infer", infer, {"inputs": []}),
            ("/v1/functions/mlp/jobs", submit, {}),
            ("/v1/functions/mlp/jobs", submit, {"records": []}),
            ("/v1/functions/mlp/jobs", submit, {"input": ""}),
        ]
        for path, schema, sent in refused:
            assert not jsonschema.Draft202012Validator(schema).is_valid(sent), (path, sent)
            assert c.post(path, json=sent).status_code in (400, 422), (path, sent)
