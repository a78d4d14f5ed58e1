"""Routing errors: 405 lists every method of a path, unknown routes and names are JSON 404s."""

from __future__ import annotations

from pathlib import Path

from support import live_server


def test_method_not_allowed_lists_every_method(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        r = c.put("/v1/functions")
        assert r.status_code == 405
        assert set(r.headers["allow"].replace(" ", "").split(",")) >= {"GET", "POST"}
        assert "error" in r.json()

        r = c.get("/v1/functions/echo/invoke")
        assert r.status_code == 405
        assert "POST" in r.headers["allow"]


def test_unknown_route_and_bad_name_are_json_404(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        r = c.get("/no/such/route")
        assert r.status_code == 404
        assert "error" in r.json()

        r = c.get("/v1/functions/Not..A..Name")
        assert r.status_code == 404
        assert "error" in r.json()
        r = c.delete("/v1/functions/Not..A..Name")
        assert r.status_code == 404
        # the server keeps serving
        assert c.get("/healthz").status_code == 200
