"""docs/fleet.md's systemd and nginx walkthrough, run as written into a scratch root:
its nginx files pass `nginx -t` laid out as Debian's nginx package lays them out, and
its systemd unit passes `systemd-analyze verify` over the files its commands create,
which are everything the unit reads."""

from __future__ import annotations

import configparser
import grp
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from fleetsupport import nginx_binary

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "fleet.md"
UNIT = ROOT / "infra" / "systemd" / "fnrt.service"
DEBIAN_NGINX = Path("/etc/nginx")


def _block(marker: str) -> list[str]:
    """The commands of the sh block after ``<!-- marker -->`` (a heredoc kept whole)."""
    text = DOC.read_text()
    after = text[text.index(f"<!-- {marker} -->") :]
    body = re.search(r"```sh\n(.*?)```", after, flags=re.S)
    assert body is not None
    commands: list[str] = []
    heredoc: str | None = None
    for line in body.group(1).splitlines():
        line = line.strip()
        if heredoc is not None:
            commands[-1] += "\n" + line
            if line == heredoc:
                heredoc = None
            continue
        commands.append(line)
        if found := re.search(r"<<'(\w+)'", line):
            heredoc = found.group(1)
    return commands


def _in(root: Path, command: str) -> str:
    """``command`` with its absolute paths moved under ``root``, and without sudo (a
    heredoc's text is left as written: it is what the file holds)."""
    line, *heredoc = command.split("\n", 1)
    line = line.removeprefix("sudo ").replace("| sudo ", "| ")
    line = re.sub(r"(?<![\w.])/(etc|opt|var)/", lambda m: f"{root}/{m.group(1)}/", line)
    return "\n".join([line, *heredoc])


def _debian_layout(root: Path, nginx: str) -> Path:
    """Debian's /etc/nginx, copied under ``root`` with its own paths moved there too."""
    if not (DEBIAN_NGINX / "nginx.conf").is_file():
        pytest.skip("Debian's nginx package is not installed (apt-get install nginx)")
    etc = root / "etc" / "nginx"
    shutil.copytree(DEBIAN_NGINX, etc, symlinks=True)
    main = etc / "nginx.conf"
    text = main.read_text().replace("/etc/nginx/", f"{etc}/")
    text = text.replace("/run/nginx.pid", f"{root}/nginx.pid")
    text = text.replace("/var/log/nginx/", f"{root}/")
    text = re.sub(r"^user .*;$", "", text, flags=re.M)
    main.write_text(text)
    return main


def _nginx_t(nginx: str, main: Path, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [nginx, "-t", "-c", str(main), "-p", str(root), "-e", str(root / "error.log")],
        capture_output=True,
        text=True,
    )


def test_the_nginx_files_pass_nginx_t_where_the_walkthrough_puts_them(tmp_path: Path) -> None:
    nginx = nginx_binary()
    main = _debian_layout(tmp_path, nginx)
    copies = [c for c in _block("fleet-nginx") if c.startswith("sudo cp infra/nginx/")]
    assert len(copies) == 2, copies
    for command in copies:
        subprocess.run(_in(tmp_path, command), shell=True, cwd=ROOT, check=True)
    done = _nginx_t(nginx, main, tmp_path)
    assert done.returncode == 0, done.stderr
    # the layout the walkthrough had before: the node list in conf.d/ fails
    (tmp_path / "etc/nginx/fnrt-nodes.conf").rename(tmp_path / "etc/nginx/conf.d/fnrt-nodes.conf")
    done = _nginx_t(nginx, main, tmp_path)
    assert done.returncode != 0 and "server" in done.stderr, done.stderr


def _unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(UNIT.read_text())
    return unit


def test_the_walkthrough_creates_what_the_unit_reads_and_the_unit_verifies(
    tmp_path: Path,
) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    commands = _block("fleet-node")
    service = _unit()["Service"]
    group = service["Group"]
    ours = grp.getgrgid(os.getgid()).gr_name  # no fnrt group here: the test's own stands in
    wheel = _built_wheel(tmp_path / "dist")
    for command in commands:
        if command.startswith(("sudo useradd", "sudo systemctl")):
            continue  # the machine's own users and services are not touched
        assert f"-g {group} " in command or "-g " not in command, (command, group)
        command = _in(root, command).replace(f"-g {group} ", f"-g {ours} ")
        command = command.replace("python3 -m venv", f"{sys.executable} -m venv --without-pip")
        if "/bin/pip install" in command:  # the wheel as `make wheel` built it, no download
            venv_python = command.split()[0].replace("/bin/pip", "/bin/python")
            command = f"{sys.executable} -m pip --python {venv_python} install -q --no-deps {wheel}"
        done = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, (command, done.stderr)
    assert any("systemctl enable --now fnrt" in c for c in commands)
    assert any(c.startswith("sudo useradd") and c.endswith(f" {service['User']}") for c in commands)

    # everything the unit reads exists where it looks, readable by whom it runs as
    executable = root / service["ExecStart"].split()[0].lstrip("/")
    assert os.access(executable, os.X_OK), executable
    env_file = root / service["EnvironmentFile"].lstrip("/")
    settings = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    token = root / settings["FNRT_ADMIN_TOKEN_FILE"].lstrip("/")
    mode = token.stat().st_mode
    assert mode & stat.S_IRGRP and not mode & stat.S_IROTH, oct(mode)
    assert grp.getgrgid(token.stat().st_gid).gr_name == ours  # the unit's Group, here
    assert len(token.read_text().strip()) >= 32
    folder = token.parent.stat()
    assert folder.st_mode & stat.S_IXGRP and grp.getgrgid(folder.st_gid).gr_name == ours
    assert "FNRT_STORE" in settings
    # the unit itself, as systemd reads it in that root (its ExecStart resolved there)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    unit_path = root / "etc/systemd/system/fnrt.service"
    assert unit_path.read_text() == UNIT.read_text()
    done = subprocess.run(
        [analyze, "verify", f"--root={root}", str(unit_path)], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    executable.unlink()  # the same check fails without what the walkthrough installed
    done = subprocess.run(
        [analyze, "verify", f"--root={root}", str(unit_path)], capture_output=True, text=True
    )
    assert done.returncode != 0 and "not executable" in done.stderr, done.stderr


def _built_wheel(out: Path) -> Path:
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = out.glob("fnrt-*.whl")
    return wheel
