"""Every sh block of docs/ marked runnable (an HTML comment ``<!-- run -->`` on the line
before it) runs as written: in a scratch folder beside the checkout's examples, with
this environment's fnrt and python first on the PATH, port 8000 moved to a free one."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support import free_port

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- run -->"


def runnable() -> list[tuple[str, str]]:
    found = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text()
        bodies = re.findall(re.escape(MARKER) + r"\n```sh\n(.*?)```", text, flags=re.S)
        assert len(bodies) == text.count(MARKER), f"{page}: {MARKER} not before a sh block"
        found += [(page.relative_to(ROOT).as_posix(), body) for body in bodies]
    return found


BLOCKS = runnable()


def test_the_docs_mark_blocks_to_run() -> None:
    assert {page for page, _ in BLOCKS} >= {"docs/install.md", "docs/quickstart.md"}


@pytest.mark.parametrize(("page", "block"), BLOCKS, ids=[p for p, _ in BLOCKS])
def test_a_runnable_block_runs(page: str, block: str, tmp_path: Path) -> None:
    port = str(free_port())
    script = block.replace("127.0.0.1:8000", f"127.0.0.1:{port}").replace(
        "--port 8000", f"--port {port}"
    )
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FNRT_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # what it leaves running is stopped with it
    )
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    assert proc.returncode == 0, f"{page}:\n{script}\n--- output:\n{out[-4000:]}"
