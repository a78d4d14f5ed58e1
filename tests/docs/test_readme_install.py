"""The README's install and tutorial, run as written: the wheel `make wheel` builds,
installed in a fresh virtualenv with none of the extras (not the checkout), then the
tutorial against it, then the pip command a missing extra names, resolved by pip."""

from __future__ import annotations

import os
import re
import shlex
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


def _section(start: str, end: str) -> str:
    text = README.read_text()
    return text[text.index(start) : text.index(end)]


def _sh_lines(section: str) -> list[str]:
    """The shell commands of ``section``'s sh blocks (comments dropped, continuations joined)."""
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("#", 1)[0].strip() if not line.startswith("#") else ""
            if command:
                lines.append(command)
    return lines


def _make_wheel(out: Path) -> Path:
    """What `make wheel` does, into ``out`` (the checkout's dist/ is left alone)."""
    recipe = (ROOT / "Makefile").read_text().split("\nwheel:", 1)[1].split("\n\n", 1)[0]
    assert "$(BIN)/python -m build --outdir dist ." in recipe, recipe
    assert "$(BIN)/twine check --strict dist/*" in recipe, recipe
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, out.iterdir())],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (wheel,) = out.glob("fnrt-*.whl")
    return wheel


def test_the_tutorial_runs_on_the_built_wheel(tmp_path: Path) -> None:
    install = _sh_lines(_section("## Install", "## Five-minute tutorial"))
    assert install[0] == "python3 -m venv .venv", install
    # the wheel goes into a virtualenv of its own: .venv already has fnrt from the
    # checkout, and pip would leave it in place (the tutorial names .venv/bin/fnrt, so
    # the wheel's virtualenv is made as .venv in a folder that has none)
    assert install[-3:] == [
        "make wheel",
        "python3 -m venv /tmp/fnrt-venv",
        "/tmp/fnrt-venv/bin/pip install dist/fnrt-*.whl",
    ], install
    wheel = _make_wheel(tmp_path / "dist")
    env = os.environ | {"PATH": os.environ.get("PATH", "")}
    env.pop("VIRTUAL_ENV", None)
    # the README's commands, in a folder holding only what `make wheel` wrote
    venv_command = install[-2].replace("python3", shlex.quote(sys.executable), 1)
    for command in (venv_command, install[-1]):
        command = command.replace("/tmp/fnrt-venv", ".venv")
        done = subprocess.run(
            command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    venv = tmp_path / ".venv"
    python = str(venv / "bin/python")
    found = subprocess.run(
        [python, "-c", f"import importlib.util as u; print([m for m in {EXTRA_MODULES!r} "
         "if u.find_spec(m)])"],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    assert found == "[]", f"the base install pulled in {found}"
    where = subprocess.run(
        [python, "-c", "import fnrt.runtime, os; print(os.path.realpath(fnrt.runtime.__file__))"],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    ).stdout  # fmt: skip
    assert where.startswith(str(venv.resolve())), f"fnrt imported from {where}, not the wheel"

    port = free_port()
    tutorial = _section("## Five-minute tutorial", "## Where next").replace(
        "127.0.0.1:8000", f"127.0.0.1:{port}"
    )
    (tmp_path / "hello").mkdir()
    for block in re.findall(r"```(?:python|toml)\n(.*?)```", tutorial, flags=re.S):
        first = block.splitlines()[0].removeprefix("# ")
        (tmp_path / first).write_text(block)
    env["FNRT_PORT"] = str(port)
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
            if command == "kill %1":  # the tutorial's last step: stop_serve does it here
                break
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

    # what needs an extra says which, in one line, naming the wheel it was installed from
    simulate = [str(venv / "bin/fnrt"), "simulate", "--synthetic", "5", "--plot", "p.png"]
    done = subprocess.run(simulate, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == "", done
    # the hint names this environment's own Python: a bare `pip`, outside an activated
    # virtualenv, would be another Python's
    source = re.escape(f"'{wheel.resolve()}[plot]'")
    said = re.fullmatch(
        "fnrt: --plot needs matplotlib, which is not installed: "
        f"({re.escape(python)}[0-9.]* -m pip install {source})\n",
        done.stderr,
    )
    assert said is not None, done.stderr
    hint = said.group(1)
    # and that command, run as printed (no virtualenv activated), would add matplotlib
    # to this fnrt (--dry-run: pip resolves it, the wheel's extra included, not installing)
    dry = hint.replace("pip install ", "pip install --dry-run ", 1)
    added = subprocess.run(dry, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert added.returncode == 0, added.stderr[-2000:]
    would = next(line for line in added.stdout.splitlines() if line.startswith("Would install"))
    assert "matplotlib-" in would, added.stdout
