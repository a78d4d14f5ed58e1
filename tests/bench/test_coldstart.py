"""bench/coldstart.py's L3 wakes: the disk cache is emptied with nothing loaded."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from s3support import MotoEndpoint

from support import write_function

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import coldstart

#: A function whose answer adds the first byte of its weights file (read at its load).
WEIGHED = """
import numpy as np

class Weighed:
    def load(self, artifacts, device):
        self.w = float(np.fromfile(artifacts["w"].path, dtype=np.uint8)[0])

    def __call__(self, batch):
        return [{"y": r["x"] + self.w} for r in batch]
"""

MANIFEST = """
name = "{name}"
handler = "handler:Weighed"

[artifacts]
w = "w.bin"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}
"""


def test_drop_blobs_leaves_nothing_to_fetch_them_again(s3: MotoEndpoint, tmp_path: Path) -> None:
    """A blob dropped under a live instance is a changed file to the scrub, which
    retires that instance and loads it again from the store: its blob was back in the
    disk cache when the bench's next L3 wake came (``--rounds 3`` failed its
    ``tier == "l3"``). drop_blobs unloads every function first."""
    server = coldstart.Server(
        tmp_path,
        "s3",
        "s3://fnrt/fns",
        dict(os.environ),
        s3.url,
        "thread",
        "--scrub-interval-s",
        "0.05",
    )
    try:
        for name, first in (("a", 1), ("b", 2)):
            files = {"w.bin": bytes([first]) * 4096}
            server.deploy(write_function(tmp_path / "fns", name, WEIGHED, MANIFEST, files))
        x = np.zeros((1, 4), np.float32)
        for name in ("a", "b"):
            server.cold_invoke(name, x)  # both loaded, their blobs in the disk cache
        assert server.states() == {"a": "warm", "b": "warm"}

        server.drop_blobs()
        assert server.states() == {"a": "cold", "b": "cold"}  # nothing to load them again
        assert not list((server.cache / "blobs").iterdir())
        for name in ("a", "b"):
            _, timings, tier = server.cold_invoke(name, x)
            assert tier == "l3", (name, tier)
            assert timings["fetch_s"] > 0
    finally:
        server.stop()
