"""``GET /v1/functions/{name}/failures``: bounded in bytes, a page at a time."""

from __future__ import annotations

from pathlib import Path

import msgpack
import msgpack_numpy
import numpy as np

from support import MISBEHAVING_HANDLER, live_server, write_function

MANIFEST = """
name = "{name}"
handler = "handler:H"

[breaker]
enabled = false
failed_inputs_bytes = 3000000
"""


def test_failed_requests_are_kept_within_their_bytes_and_paged(tmp_path: Path) -> None:
    folder = write_function(tmp_path / "src", "raises", MISBEHAVING_HANDLER, manifest=MANIFEST)
    with live_server(tmp_path) as srv, srv.client() as c:
        srv.deploy(folder)
        x = np.full((250_000, 1), 5, dtype=np.float32)  # 1 MB each; 5: the handler raises
        body = msgpack.packb({"x": x}, default=msgpack_numpy.encode)
        headers = {"content-type": "application/msgpack"}
        for _ in range(20):  # twenty failed 1 MB requests (was: all kept, 1 GB at 50 MB each)
            assert (
                c.post("/v1/functions/raises/invoke", content=body, headers=headers).status_code
                == 500
            )
        scheduler = srv.call(srv.registry.get("raises"))
        assert scheduler.protection.failure_bytes <= 3_000_000
        first = c.get("/v1/functions/raises/failures", params={"limit": 2}).json()
        assert first["total"] == 3 and len(first["failures"]) == 2
        assert first["next_offset"] == 2
        rest = c.get("/v1/functions/raises/failures", params={"offset": 2}).json()
        assert len(rest["failures"]) == 1 and rest["next_offset"] is None
        assert rest["failures"][0]["inputs_bytes"] == 1_000_000
        assert c.get("/v1/functions/raises/failures", params={"limit": 0}).status_code == 400
        assert c.get("/v1/functions/raises/failures", params={"limit": "x"}).status_code == 400
