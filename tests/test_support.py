"""The test helpers themselves: a live server leaves nothing open behind it."""

from __future__ import annotations

from pathlib import Path

from support import live_server, open_fds


def test_live_servers_started_and_stopped_leave_no_descriptors_open(tmp_path: Path) -> None:
    """Each server's event loop is closed when it stops: before, each left its epoll,
    io_uring and eventfd descriptors, its signal pipe and a /dev/null open (6 a
    server), and a test worker that started hundreds passed descriptor 1023."""
    with live_server(tmp_path) as srv, srv.client() as c:  # what the first one imports
        assert c.get("/healthz").status_code == 200
    before = open_fds()
    for _ in range(5):
        with live_server(tmp_path) as srv, srv.client() as c:
            assert c.get("/healthz").status_code == 200
    left = {fd: what for fd, what in open_fds().items() if before.get(fd) != what}
    assert len(left) <= 2, left
