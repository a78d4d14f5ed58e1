"""The data routes' template: how an answer's head is written at the connection."""

from __future__ import annotations

import gc
import types
from pathlib import Path

import pytest

from fnrt.runtime.http.data import header_lines
from support import live_server, write_function

PINNED = {"x-fnrt-version": "v-000000000000"}
JSON = {"content-type": "application/json"}


def test_header_lines_refuse_a_value_with_a_line_break() -> None:
    assert header_lines([(b"x-a", b"1"), (b"x-b", b"two")]) == b"x-a: 1\r\nx-b: two\r\n"
    with pytest.raises(ValueError, match="x-b"):
        header_lines([(b"x-b", b"two\r\nset-cookie: evil")])


def test_header_map_decodes_names_and_values_the_last_repeat_winning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Headers by name, decoded as Latin-1 (names once, kept up to a bound whatever
    names clients send), a repeated header's last value winning, as before."""
    from fnrt.runtime.http import data

    monkeypatch.setattr(data, "_NAMES", {})
    monkeypatch.setattr(data, "_NAMES_MAX", 4)
    scope = {"headers": [(b"x-a", b"1"), (b"x-\xe9", b"caf\xe9"), (b"x-a", b"2")]}
    for _ in range(2):
        assert data.header_map(scope) == {"x-a": "2", "x-\xe9": "caf\xe9"}
    many = {"headers": [(b"x-%d" % i, b"v") for i in range(50)]}
    assert data.header_map(many) == {f"x-{i}": "v" for i in range(50)}
    assert len(data._NAMES) <= 4  # forgotten when full, then kept again
    assert data.header_map(scope) == {"x-a": "2", "x-\xe9": "caf\xe9"}


def test_a_refused_request_leaves_no_cycle_for_the_garbage_collector(tmp_path: Path) -> None:
    """A refusal's exception, re-raised where its answer is written, held the frame that
    raised it: a cycle per refused request (exception, traceback, frame), which only the
    collector frees. At 17,000 refusals a second its collections took a sixth of the
    loop and gave 422s a p99 of 44 ms (``bench/refused.py``)."""
    with live_server(tmp_path) as srv, srv.client() as c:
        srv.deploy(write_function(tmp_path / "src", "echo"))
        refused = [
            ({"y": [[1.0, 2.0, 3.0, 4.0]]}, "/v1/functions/echo/invoke", {}),  # 422
            ({"x": [[1.0, 2.0]]}, "/v1/functions/echo/invoke", {}),  # 422: its shape
            ({"x": [[1.0, 2.0, 3.0, 4.0]]}, "/v1/functions/nope/invoke", {}),  # 404
            ({"x": [[1.0, 2.0, 3.0, 4.0]]}, "/v1/functions/echo/invoke", PINNED),  # 404
        ]
        for body, path, headers in refused:  # each seen once: what is made once is made
            c.post(path, json=body, headers=headers)
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(20):
                for body, path, headers in refused:
                    assert c.post(path, json=body, headers=headers).status_code in (404, 422)
                assert c.post(path, content=b"{nope", headers=JSON).status_code == 400
            gc.collect()
            cycles = [o for o in gc.garbage if isinstance(o, BaseException)]
            cycles += [
                o
                for o in gc.garbage
                if isinstance(o, types.FrameType) and "/runtime/" in o.f_code.co_filename
            ]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert not cycles, cycles[:5]
