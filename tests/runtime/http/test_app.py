"""The app's data routes as its connections find them (``data_apps``)."""

from __future__ import annotations

from pathlib import Path

from fnrt.runtime.http import app as app_module
from fnrt.runtime.http.app import build_app, data_apps
from support import make_node


def test_a_data_path_finds_its_route_and_its_parameters(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    find = data_apps(build_app(node.settings, node))
    assert find is not None
    route = find("/v1/functions/mlp/invoke")
    assert route.args == (node, ("mlp",))  # the route's serve, bound to the node and params
    assert find("/v1/functions/mlp/invoke") is route  # matched once, kept
    assert find("/v2/models/mlp/infer").args == (node, ("mlp",))
    assert find("/v1/functions/mlp") is None  # not a data route: the app answers it
    assert find("/healthz") is None


def test_the_paths_kept_are_bounded(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    find = data_apps(build_app(node.settings, node))
    assert find is not None
    first = find("/v1/functions/f0/invoke")
    for i in range(1, app_module.DATA_PATHS_KEPT + 1):
        find(f"/v1/functions/f{i}/invoke")
    assert find("/v1/functions/f0/invoke") is not first  # forgotten, matched again
    assert find("/v1/functions/f0/invoke").args[1] == ("f0",)


def test_a_cors_server_leaves_every_request_to_its_app(tmp_path: Path) -> None:
    node = make_node(tmp_path, cors_origins=("https://example.test",))
    assert data_apps(build_app(node.settings, node)) is None
