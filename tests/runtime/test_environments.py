"""Functions with environments of their own, through a live server and the CLI."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fnrt.client import Client
from fnrt.runtime.cli.main import main
from support import live_server, write_function

HANDLER = """
import humanize  # only the function's environment has it
import numpy as np

def handle(batch):
    digits = len(humanize.intcomma(1000000))  # "1,000,000": 9
    return [{"y": r["x"] * digits} for r in batch]
"""

MANIFEST = """
name = "{name}"
handler = "handler:handle"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 4] }}
{environment}
"""


def _function(
    root: Path, name: str, environment: str, files: dict[str, bytes] | None = None
) -> Path:
    return write_function(root, name, HANDLER, MANIFEST, files=files, environment=environment)


def test_functions_answer_from_their_environment_and_share_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src"
    one = _function(src, "one", '[environment]\nrequirements = ["humanize==4.9.0"]')
    two = _function(
        src,
        "two",
        '[environment]\nrequirements_file = "requirements.txt"',
        files={"requirements.txt": b"# the same, spelled otherwise\nHumanize == 4.9.0\n"},
    )
    bare = _function(src, "bare", "")
    broken = _function(src, "broken", '[environment]\nrequirements = ["fnrt-no-such-pkg-9d2e==1"]')
    with live_server(tmp_path) as srv, Client(srv.url) as fnrt:
        url = ("--server", srv.url, "--quiet")
        assert main(["deploy", str(one), *url]) == 0, capsys.readouterr().err
        assert main(["deploy", str(two), *url]) == 0, capsys.readouterr().err
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        for name in ("one", "two"):
            np.testing.assert_array_equal(fnrt.invoke(name, x=x)["y"], x * 9)
            assert fnrt.describe(name)["instance"]["isolation"] == "process"
        manifest = fnrt.describe("two")["manifest"]["environment"]
        assert manifest["requirements"] == ["Humanize == 4.9.0"]  # the file's lines, stored
        envs = tmp_path / "cache" / "envs"
        built = [p for p in envs.iterdir() if (p / "resolved.txt").is_file()]
        assert len(built) == 1 and (built[0] / "resolved.txt").read_text() == "humanize==4.9.0\n"
        capsys.readouterr()
        # without an environment the server's packages are all it has: refused at deploy
        assert main(["deploy", str(bare), *url]) == 1
        err = capsys.readouterr().err
        assert "error 422" in err and "No module named 'humanize'" in err, err
        # a requirement that cannot be met: a 422 with pip's words, nothing stored
        assert main(["deploy", str(broken), *url]) == 1
        err = capsys.readouterr().err
        assert "error 422: the function's environment failed resolving" in err, err
        assert "fnrt-no-such-pkg-9d2e" in err
        assert {f["name"] for f in fnrt.list()} == {"one", "two"}


def test_a_node_that_cannot_build_a_stored_environment_answers_503(tmp_path: Path) -> None:
    from fnrt.runtime.deployment import cut_over
    from support import error_of, publish

    # stored by a node that could build it; this one cannot (say, the index is down)
    folder = _function(
        tmp_path / "src", "elsewhere", '[environment]\nrequirements = ["fnrt-x-9d2e==1"]'
    )
    with live_server(tmp_path) as srv, srv.client() as c:
        vm = publish(srv.node.repository, folder)
        srv.node.repository.put_version(vm)
        cut_over(srv.node.repository, vm)
        r = c.post("/v1/functions/elsewhere/invoke", json={"x": [[1, 2, 3, 4]]})
        assert r.status_code == 503, r.text
        assert "its environment cannot be built on this node" in error_of(r)["error"]
        assert c.get("/healthz").status_code == 200


PID_HANDLER = """
import os
import humanize  # only the function's environment has it
import numpy as np

def handle(batch):
    assert humanize.intcomma(1000) == "1,000"
    return [{"y": np.full((1, 4), os.getpid(), dtype=np.float32)} for r in batch]
"""


def test_a_cold_start_in_an_environment_takes_a_spare_of_that_environment(
    tmp_path: Path,
) -> None:
    from fnrt.runtime.node import build_node
    from support import node_settings, wait_until

    node = build_node(node_settings(tmp_path))  # spare workers on, as by default
    spares = node.loader.spares
    assert spares is not None
    folder = write_function(
        tmp_path / "src",
        "envy",
        PID_HANDLER,
        MANIFEST,
        environment='[environment]\nrequirements = ["humanize==4.9.0"]',
    )
    x = np.zeros((1, 4), dtype=np.float32)
    with live_server(tmp_path, node=node) as srv, Client(srv.url) as fnrt:
        assert main(["deploy", str(folder), "--server", srv.url, "--quiet"]) == 0
        routing, _ = node.repository.get_routing("envy")
        stored = node.repository.get_version("envy", routing.primary)
        assert {"humanize", "numpy"} <= set(stored.imports)  # read from its code
        # built at its deploy: its environment keeps a spare with what its code imports
        (key,) = spares._environments
        wait_until(lambda: len(spares._environments[key].spares) == 1, timeout_s=30)
        (spare,) = spares._environments[key].spares
        assert {"humanize", "numpy"} <= spare.imports
        assert int(fnrt.invoke("envy", x=x)["y"][0, 0]) == spare.process.pid  # its first
        assert spares.taken == 1
        # replaced after that load; the next cold start takes the replacement
        wait_until(lambda: len(spares._environments[key].spares) == 1, timeout_s=30)
        (replacement,) = spares._environments[key].spares
        with srv.client() as c:
            assert c.post("/v1/functions/envy/unload").status_code == 200
        assert int(fnrt.invoke("envy", x=x)["y"][0, 0]) == replacement.process.pid
        assert spares.taken == 2
        # the server's own spares never serve it, nor import its packages
        assert all("humanize" not in s.imports for s in spares._spares)
    # a new node on the store (a cache of its own, the environment not built there):
    # what the version imports is not the server's spares' to learn
    settings = replace(node_settings(tmp_path), cache_dir=tmp_path / "second-cache")
    second = build_node(settings)
    with live_server(tmp_path / "second", node=second):
        assert second.loader.spares is not None
        assert second.loader.spares.learned == set()
        assert not second.loader.spares._environments
