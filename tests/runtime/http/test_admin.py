"""Admin routes: blob upload, deploy with validation, list, describe, warm, delete, auth."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from fnrt.client import Client, ServerError
from fnrt.runtime.cli.upload import upload_bundle
from support import hostile_bundle, live_server, packed, write_function


def deploy_folder(client: Client, folder: Path) -> dict:
    vm, bundle = packed(folder)
    upload_bundle(client, bundle, show_progress=False)
    return client.deploy(vm)


def test_deploy_list_describe_warm_delete(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "src", "echo")
    with live_server(tmp_path) as srv, Client(srv.url) as client:
        result = deploy_folder(client, folder)
        assert result["created"] is True
        again = deploy_folder(client, folder)
        # same content, same id; each deploy reports how long its own readiness check took
        took = [answer["checks"]["ready"].pop("seconds") for answer in (result, again)]
        assert all(seconds >= 0 for seconds in took)
        assert again == {**result, "created": False, "rollout": "unchanged"}

        assert [(f["name"], f["state"]) for f in client.list()] == [("echo", "cold")]
        described = client.describe("echo")
        assert described["version"] == result["version"]
        assert described["traffic"] == {result["version"]: 100}
        assert described["manifest"]["inputs"] == {"x": {"dtype": "float32", "shape": [-1, 4]}}

        with srv.client() as c:
            assert c.post("/v1/functions/echo/warm").json()["state"] == "warm"
        assert client.describe("echo")["instance"]["loads"] == 1
        with srv.client() as c:
            assert c.post("/v1/functions/echo/unload").json() == {
                "name": "echo",
                "unloaded": True,
                "stopped_batches": 0,
                "state": "cold",
            }
            assert c.post("/v1/functions/echo/unload").json()["unloaded"] is False

        client.delete("echo")
        assert client.list() == []
        with pytest.raises(ServerError) as info:
            client.describe("echo")
        assert info.value.status == 404
        with srv.client() as c:
            assert (
                c.post("/v1/functions/echo/invoke", json={"x": [[1, 2, 3, 4]]}).status_code == 404
            )


def test_upload_only_sends_missing_blobs(tmp_path: Path) -> None:
    weights = b"\x01" * 300_000
    folder = write_function(tmp_path / "src", "echo", files={"w.bin": weights})
    toml = folder / "fnrt.toml"
    toml.write_text(
        toml.read_text().replace(
            'handler = "handler:Echo"', 'handler = "handler:Echo"\n\n[artifacts]\nw = "w.bin"'
        )
    )
    with live_server(tmp_path) as srv, Client(srv.url) as client:
        vm, bundle = packed(folder)
        assert upload_bundle(client, bundle, show_progress=False) == (2, vm.size_bytes)
        assert upload_bundle(client, bundle, show_progress=False) == (0, 0)
        client.deploy(vm)
        path = srv.node.repository.blob_path(hashlib.sha256(weights).hexdigest())
        assert path is not None and path.read_bytes() == weights


def test_blob_that_does_not_match_its_digest_is_refused(tmp_path: Path) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        digest = hashlib.sha256(b"good").hexdigest()
        r = c.put(f"/v1/blobs/{digest}", content=b"evil")
        assert r.status_code == 400
        assert "expected sha256:" + digest in r.json()["error"]
        assert c.head(f"/v1/blobs/{digest}").status_code == 404
        assert not srv.node.repository.has_blob(digest)
        assert c.put("/v1/blobs/not-a-digest", content=b"x").status_code == 400
        r = c.put(f"/v1/blobs/{digest}", content=b"good")
        assert r.status_code == 201
        assert c.head(f"/v1/blobs/{digest}").status_code == 200


def test_a_blob_uploaded_to_a_folder_store_is_verified_as_it_arrives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fnrt.loader import integrity
    from fnrt.loader.integrity import read_record

    body = bytes(range(256)) * 40_000  # 10 MB: several spool writes
    digest = hashlib.sha256(body).hexdigest()
    with live_server(tmp_path) as srv, srv.client() as c:
        verifier = srv.node.loader.verifier
        assert c.put(f"/v1/blobs/{digest}", content=body).status_code == 201
        stored = srv.node.repository.blob_path(digest)
        assert stored is not None and read_record(verifier.root / digest) is not None

        def no_sha256(path: Path) -> integrity.Fingerprint:
            raise AssertionError("read again through sha256")

        monkeypatch.setattr(integrity, "fingerprint", no_sha256)
        verifier.check(stored, digest)  # its first load here: the record, no sha256
        stored.touch()  # a new identity: read through xxh3, which the upload took right
        verifier.check(stored, digest)
        bad = hashlib.sha256(b"good").hexdigest()
        assert c.put(f"/v1/blobs/{bad}", content=b"evil").status_code == 400
        assert read_record(verifier.root / bad) is None  # refused: nothing recorded


@pytest.mark.parametrize(
    ("handler", "manifest_edit", "status", "words"),
    [
        (
            "import nonexistent_module\n",
            None,
            422,
            "cannot import handler module 'handler': ModuleNotFoundError",
        ),
        ("x = 1\n", None, 422, "has no attribute 'Echo'"),
        ("class Echo:\n    pass\n", None, 422, "must define __call__(self, batch)"),
        (
            "class Echo:\n    def __init__(self, a): pass\n    def __call__(self, b): return b\n",
            None,
            422,
            "constructible with no arguments",
        ),
        (
            "class Echo:\n    def load(self): pass\n    def __call__(self, b): return b\n",
            None,
            422,
            "load must take (self, artifacts, device)",
        ),
        ("def Echo(): return []\n", None, 422, "must take one argument: the batch"),
    ],
)
def test_deploy_reports_handler_errors_and_routes_nothing(
    tmp_path: Path, handler: str, manifest_edit: str | None, status: int, words: str
) -> None:
    folder = write_function(tmp_path / "src", "echo", handler)
    with live_server(tmp_path) as srv, Client(srv.url) as client:
        with pytest.raises(ServerError) as info:
            deploy_folder(client, folder)
        assert info.value.status == status
        assert words in info.value.message
        assert client.list() == []


def test_deploy_body_with_a_bad_manifest_names_the_field(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "src", "echo")
    with live_server(tmp_path) as srv, Client(srv.url) as client:
        vm, bundle = packed(folder)
        upload_bundle(client, bundle, show_progress=False)
        body = vm.to_dict()
        body.pop("version")
        body["manifest"]["batching"]["max_batch_size"] = 0
        with srv.client() as c:
            r = c.post("/v1/functions", json=body)
            assert r.status_code == 422
            assert r.json()["field"] == "batching.max_batch_size"
            body["manifest"]["batching"]["max_batch_size"] = 4
            body["bundle"]["digest"] = "0" * 64
            r = c.post("/v1/functions", json=body)
            assert r.status_code == 404
            assert "0" * 64 in r.json()["error"]
            assert c.post("/v1/functions", content=b"{not json").status_code == 400


def test_admin_token_guards_admin_routes_but_not_invoke(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "src", "echo")
    with live_server(tmp_path, admin_token="s3cret") as srv:
        with (
            Client(srv.url) as anonymous,
            pytest.raises(ServerError) as info,
        ):
            deploy_folder(anonymous, folder)
        assert info.value.status == 401
        with (
            Client(srv.url, token="wrong") as wrong,
            pytest.raises(ServerError),
        ):
            wrong.list()
        with Client(srv.url, token="s3cret") as admin:
            deploy_folder(admin, folder)
            assert [f["name"] for f in admin.list()] == ["echo"]
        with srv.client() as c:
            assert c.get("/v1/functions").status_code == 401
            assert c.get("/v1/functions").headers["www-authenticate"] == "Bearer"
            assert (
                c.post("/v1/functions/echo/invoke", json={"x": [[1, 2, 3, 4]]}).status_code == 200
            )


def test_deploys_that_would_write_outside_their_folders_are_refused(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "src", "echo", files={"w/a.bin": b"a", "w/b.bin": b"b"})
    manifest = (folder / "fnrt.toml").read_text() + '\n[artifacts]\nweights = "w"\n'
    (folder / "fnrt.toml").write_text(manifest)
    vm, bundle = packed(folder)
    with live_server(tmp_path) as srv, srv.client() as c:
        for ref, source in bundle.blob_sources():
            srv.node.repository.put_blob(ref.digest, source)
        body = vm.to_dict()
        body.pop("version")
        traversal = json.loads(json.dumps(body))
        traversal["artifacts"]["weights"]["files"][0]["rel"] = "../../x"
        r = c.post("/v1/functions", json=traversal)
        assert r.status_code == 422 and "plain relative path" in r.json()["error"]
        hostile = hostile_bundle(("../evil.py", b"x = 1", None))
        digest = hashlib.sha256(hostile).hexdigest()
        srv.node.repository.put_blob(digest, hostile)
        tar = json.loads(json.dumps(body))
        tar["bundle"] = {"rel": "", "digest": digest, "size_bytes": len(hostile)}
        r = c.post("/v1/functions", json=tar)  # was a 500, then a reset connection
        assert r.status_code == 400 and "not a plain relative path" in r.json()["error"]
        assert c.post("/v1/functions", json=body).status_code == 201  # same connection
        assert not (tmp_path / "evil.py").exists() and not (tmp_path / "x").exists()


def test_the_listing_pages_and_reads_what_it_does_not_serve(tmp_path: Path) -> None:
    from fnrt.functions.routing import Routing
    from fnrt.loader.repository import Repository
    from fnrt.loader.stores import FileStore
    from support import publish

    other = Repository(FileStore(tmp_path / "store"))  # deployed before the node started
    names = [f"fn{i}" for i in range(7)]
    for name in names:
        vm = publish(other, write_function(tmp_path / "src", name))
        other.put_version(vm)
        other.update_routing(name, lambda _, v=vm.version: Routing.first(v, "t"))
    with live_server(tmp_path) as srv, Client(srv.url) as client, srv.client() as c:
        assert srv.node.registry.entries() == []  # none loads at start: none held
        first = c.get("/v1/functions", params={"limit": 3}).json()
        assert [f["name"] for f in first["functions"]] == names[:3]
        assert first["next_cursor"] == "fn2"
        assert {f["state"] for f in first["functions"]} == {"cold"}
        rest = c.get("/v1/functions", params={"limit": 1000, "cursor": "fn2"}).json()
        assert [f["name"] for f in rest["functions"]] == names[3:]
        assert rest["next_cursor"] is None
        assert srv.node.registry.entries() == []  # listed, still not held
        assert [f["name"] for f in client.list()] == names
        assert client.list_page(limit=2, cursor="fn5")["functions"][0]["name"] == "fn6"
        c.post("/v1/functions/fn4/invoke", json={"x": [[1, 2, 3, 4]]})
        warm = c.get("/v1/functions", params={"cursor": "fn3", "limit": 1}).json()
        assert warm["functions"][0] == {
            **warm["functions"][0],
            "name": "fn4",
            "state": "warm",
        }
        for query, why in [
            ({"limit": 0}, "?limit= must be from 1 to 1000"),
            ({"limit": "ten"}, "?limit='ten' is not an integer"),
            ({"cursor": "Not A Name"}, "is not a function name"),
            ({"cursor": ""}, "is not a function name"),
        ]:
            refused = c.get("/v1/functions", params=query)
            assert refused.status_code == 400 and why in refused.json()["error"], refused.text
        (tmp_path / "store" / "functions" / "fn6" / "routing.json").write_text("{not json")
        assert [f["name"] for f in client.list()] == names[:6]  # one unreadable: the rest list
