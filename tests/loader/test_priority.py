"""A spare's warming at a low CPU priority: a thread of its own, and raised back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from fnrt.loader.priority import (
    LOW_NICE,
    group_nice,
    in_background,
    own_nice,
    restore,
    set_group_nice,
    thread_nices,
)


def test_work_in_the_background_runs_lower_and_the_caller_stays_where_it_was() -> None:
    seen: list[int] = []
    before = own_nice()
    in_background(lambda: seen.append(own_nice()), 5)
    assert seen == [min(before + 5, 19)]
    assert own_nice() == before
    assert thread_nices(os.getpid())[threading.get_native_id()] == before


def test_what_the_background_work_raised_is_raised_to_the_caller() -> None:
    def fails() -> None:
        raise ImportError("no module named nowhere")

    with pytest.raises(ImportError, match="nowhere"):
        in_background(fails, 5)


def test_restore_raises_threads_back_to_the_main_threads_priority() -> None:
    lowered, release = threading.Event(), threading.Event()
    tid: list[int] = []

    def low() -> None:
        tid.append(threading.get_native_id())
        os.setpriority(os.PRIO_PROCESS, tid[0], own_nice() + 3)
        lowered.set()
        release.wait(30)

    thread = threading.Thread(target=low)
    thread.start()
    try:
        assert lowered.wait(30)
        main = thread_nices(os.getpid())[os.getpid()]
        assert thread_nices(os.getpid())[tid[0]] == min(main + 3, 19)
        if restore(os.getpid()):  # allowed here (CAP_SYS_NICE or RLIMIT_NICE)
            assert thread_nices(os.getpid())[tid[0]] == main
        else:
            assert thread_nices(os.getpid())[tid[0]] > main
    finally:
        release.set()
        thread.join()


def test_a_process_that_ended_has_no_threads_to_restore() -> None:
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    pid = int(ended.stdout)
    assert thread_nices(pid) == {}
    assert restore(pid)


def test_a_sessions_scheduling_group_is_lowered_and_raised_back() -> None:
    session = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        start_new_session=True,  # as a worker: a session, so an autogroup, of its own
    )
    try:
        if group_nice(session.pid) is None:
            pytest.skip("no autogroups on this kernel")
        assert set_group_nice(session.pid, LOW_NICE)
        assert group_nice(session.pid) == LOW_NICE
        assert set_group_nice(session.pid, 0)  # raising it back to 0 needs no privilege
        assert group_nice(session.pid) == 0
    finally:
        session.kill()
        session.wait()
