"""The app's data routes as its connections find them (``data_apps``)."""

from __future__ import annotations

from pathlib import Path

from fnrt.runtime.http import app as app_module
from fnrt.runtime.http.app import build_app, data_apps
from fnrt.runtime.http.invoke import INVOKE
from fnrt.runtime.http.oip.infer import INFER
from support import make_node


def test_a_data_path_finds_its_route_and_its_parameters(tmp_path: Path) -> None:
    node = make_node(tmp_path)
    find = data_apps(build_app(node.settings, node))
    assert find is not None
    route = find("/v1/functions/mlp/invoke")
    assert (route.entry, route.node, route.params) == (INVOKE, node, ("mlp",))  # bound to both
    assert find("/v1/functions/mlp/invoke") is route  # matched once, kept
    infer = find("/v2/models/mlp/infer")
    assert (infer.entry, infer.node, infer.params) == (INFER, node, ("mlp",))
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
    assert find("/v1/functions/f0/invoke").params == ("f0",)


def test_a_cors_server_leaves_every_request_to_its_app(tmp_path: Path) -> None:
    node = make_node(tmp_path, cors_origins=("https://example.test",))
    assert data_apps(build_app(node.settings, node)) is None
