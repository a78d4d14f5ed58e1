"""The README's install and tutorial, run as written in a fresh virtualenv holding only
the base install (`pip install fnrt`, from this checkout) and none of the extras."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from support import ServeProcess, free_port, stop_serve, wait_serving

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: Modules only an extra installs: none may be in the tutorial's environment.
EXTRA_MODULES = (
    "torch", "onnxruntime", "onnx", "boto3", "redis", "matplotlib", "cuda", "opentelemetry"
)  # fmt: skip


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def _tutorial() -> str:
    text = README.read_text()
    return text[text.index("## Five-minute tutorial") : text.index("## The handler contract")]


def _sh_lines(section: str) -> list[str]:
    """The shell commands of ``section``'s sh blocks (comments dropped, continuations joined)."""
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("#", 1)[0].strip() if not line.startswith("#") else ""
            if command:
                lines.append(command)
    return lines


def test_the_tutorial_runs_on_the_base_install(tmp_path: Path) -> None:
    install = [line for line in _sh_lines(README.read_text()) if "pip install fnrt" in line]
    assert install == [".venv/bin/pip install fnrt"], install
    venv = tmp_path / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # this environment's pip installs into it (quicker than bootstrapping its own)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q"]
    pip += ["--no-compile", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "-c", str(ROOT / "constraints.txt"), str(ROOT)],
        check=True,
        timeout=600,
        capture_output=True,  # pip's warnings about this machine's extra index
    )
    python = str(tmp_path / ".venv/bin/python")
    found = subprocess.run(
        [python, "-c", f"import importlib.util as u; print([m for m in {EXTRA_MODULES!r} "
         "if u.find_spec(m)])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert found == "[]", f"the base install pulled in {found}"

    port = free_port()
    tutorial = _tutorial().replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    (tmp_path / "hello").mkdir()
    for block in re.findall(r"```(?:python|toml)\n(.*?)```", tutorial, flags=re.S):
        first = block.splitlines()[0].removeprefix("# ")
        (tmp_path / first).write_text(block)
    env = os.environ | {"FNRT_PORT": str(port), "PATH": os.environ.get("PATH", "")}
    env.pop("VIRTUAL_ENV", None)
    commands = _sh_lines(tutorial)
    assert commands[1].startswith(".venv/bin/fnrt serve &"), commands
    proc = subprocess.Popen(
        commands[1].removesuffix("&").split(),
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    log: list[str] = []  # read as it comes, so a full pipe never blocks the server
    threading.Thread(target=lambda: log.extend(proc.stderr or []), daemon=True).start()
    server = ServeProcess(f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_serving(server)
        printed = []
        for command in [commands[0], *commands[2:]]:
            if command.startswith("curl") and shutil.which("curl") is None:
                continue  # the same request is made by the client below
            done = subprocess.run(
                command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True
            )
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            printed.append(done.stdout.strip())
    finally:
        stop_serve(server)
    out = "\n".join(printed)
    assert re.search(r"^hello v-[0-9a-f]{12} deployed$", out, re.M), out
    assert '{"y":[[2.5,5.0,7.5]]}' in out or shutil.which("curl") is None  # curl's answer
    assert "[[2.5 2.5 2.5]\n [2.5 2.5 2.5]]" in out  # hello_client.py
    assert '{"y": [[2.5, 5.0, 7.5]]}' in out  # fnrt invoke
    # and what needs an extra says which, in one line, before doing anything
    done = subprocess.run(
        [str(venv / "bin/fnrt"), "simulate", "--synthetic", "5", "--plot", "p.png"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        "fnrt: --plot needs matplotlib, which is not installed: pip install 'fnrt[plot]'\n"
    )
