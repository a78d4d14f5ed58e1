"""Invoke keys, token files, CORS, TLS and the refusal to serve open admin to a network."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fnrt.functions.errors import Unauthorized
from fnrt.runtime.access import InvokeKeys
from fnrt.runtime.settings import read_token_file
from support import live_server, serve_process, write_function

X = {"x": [[1, 2, 3, 4]]}


def test_keys_per_function_and_server_wide() -> None:
    keys = InvokeKeys({"*": ["team"], "mlp": ["mlp-a"]}, admin_token="root")
    bearer = lambda k: {"authorization": f"Bearer {k}"}  # noqa: E731
    keys.check("mlp", bearer("mlp-a"))
    keys.check("mlp", bearer("team"))
    keys.check("other", bearer("team"))
    keys.check("other", bearer("root"))  # the admin token passes everywhere
    for function, headers in (("mlp", {}), ("mlp", bearer("nope")), ("other", bearer("mlp-a"))):
        with pytest.raises(Unauthorized):
            keys.check(function, headers)
    InvokeKeys({"mlp": ["k"]}, None).check("free", {})  # no keys: no check
    with pytest.raises(ValueError, match="non-empty strings"):
        InvokeKeys({"mlp": [""]}, None)


def test_a_token_file_gives_its_first_line(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  s3cret  \nignored\n")
    assert read_token_file(path) == "s3cret"
    path.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_token_file(path)


def test_invokes_need_a_key_where_the_keys_file_says(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"locked": ["k-1"]}))
    with live_server(tmp_path, invoke_keys_file=keys) as srv, srv.client() as c:
        for name in ("locked", "open"):
            folder = write_function(tmp_path / "src", name)
            srv.deploy(folder)
        r = c.post("/v1/functions/locked/invoke", json=X)
        assert r.status_code == 401 and "Bearer" in r.json()["error"]
        ok = c.post("/v1/functions/locked/invoke", json=X, headers={"authorization": "Bearer k-1"})
        assert ok.status_code == 200
        infer = {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]
        }
        assert c.post("/v2/models/locked/infer", json=infer).status_code == 401
        assert c.post("/v1/functions/open/invoke", json=X).status_code == 200
        # what a model takes, how it is configured, if it is ready and how much it is
        # called: only to a caller with a key, as its inferences
        bearer = {"authorization": "Bearer k-1"}
        for path in ("", "/ready", "/config", "/stats"):
            r = c.get(f"/v2/models/locked{path}")
            assert r.status_code == 401 and "Bearer" in r.json()["error"], path
            assert c.get(f"/v2/models/locked{path}", headers=bearer).status_code == 200, path
            assert c.get(f"/v2/models/open{path}").status_code == 200, path
        version = c.get("/v2/models/locked", headers=bearer).json()["versions"][0]
        assert c.get(f"/v2/models/locked/versions/{version}/config").status_code == 401
        every = c.get("/v2/models/stats").json()["model_stats"]  # those this caller may call
        assert [m["name"] for m in every] == ["open"]
        with_key = c.get("/v2/models/stats", headers=bearer).json()["model_stats"]
        assert sorted(m["name"] for m in with_key) == ["locked", "open"]
        paths = c.get("/openapi.json").json()["paths"]  # its schema: only with a key
        assert "/v1/functions/open/invoke" in paths and "/v1/functions/locked/invoke" not in paths
        paths = c.get("/openapi.json", headers=bearer).json()["paths"]
        assert "/v1/functions/locked/invoke" in paths


def test_cors_preflight_and_exposed_headers(tmp_path: Path) -> None:
    origin = "https://app.example"
    with live_server(tmp_path, cors_origins=(origin,)) as srv, srv.client() as c:
        folder = write_function(tmp_path / "src", "echo")
        srv.deploy(folder)
        preflight = c.options(
            "/v1/functions/echo/invoke",
            headers={
                "origin": origin,
                "access-control-request-method": "POST",
                "access-control-request-headers": "content-type",
            },
        )
        assert preflight.status_code == 200  # was 405
        assert preflight.headers["access-control-allow-origin"] == origin
        r = c.post("/v1/functions/echo/invoke", json=X, headers={"origin": origin})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == origin
        assert "x-fnrt-version" in r.headers["access-control-expose-headers"]
        other = c.post("/v1/functions/echo/invoke", json=X, headers={"origin": "https://evil"})
        assert "access-control-allow-origin" not in other.headers


def test_serve_refuses_a_network_address_without_an_admin_token(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "fnrt.runtime.cli.main", "serve", "--host", "0.0.0.0"]
    argv += ["--store", str(tmp_path / "store"), "--cache-dir", str(tmp_path / "cache")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "refusing to serve 0.0.0.0 without an admin token" in done.stderr


def test_serve_over_tls_with_a_token_file(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    request = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    subject = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    made = subprocess.run(
        ["openssl", *request, *subject, "-keyout", str(key), "-out", str(cert)],
        capture_output=True,
    )
    if made.returncode != 0:
        pytest.skip("openssl could not make a test certificate")
    token = tmp_path / "token"
    token.write_text("from-a-file\n")
    flags = [
        "--ssl-certfile",
        str(cert),
        "--ssl-keyfile",
        str(key),
        "--admin-token-file",
        str(token),
    ]
    trust = ssl.create_default_context(cafile=str(cert))
    with serve_process(tmp_path, *flags, scheme="https", verify=trust) as server:
        assert server.url.startswith("https://")
        with httpx.Client(base_url=server.url, verify=trust) as c:
            assert c.get("/healthz").status_code == 200
            assert c.get("/v1/functions").status_code == 401
            auth = {"authorization": "Bearer from-a-file"}
            assert c.get("/v1/functions", headers=auth).status_code == 200
