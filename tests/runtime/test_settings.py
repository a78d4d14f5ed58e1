"""Server settings: FNRT_* variables and the checks that refuse a bad value."""

from __future__ import annotations

import pytest

from fnrt.runtime.settings import ServerSettings, env_server_settings


def test_isolation_defaults_to_process_and_reads_its_variable() -> None:
    assert ServerSettings().isolation == "process"
    found = env_server_settings({"FNRT_ISOLATION": "thread"})
    assert ServerSettings(**found).isolation == "thread"  # type: ignore[arg-type]


def test_an_unknown_isolation_is_refused() -> None:
    with pytest.raises(ValueError, match="isolation: 'threads' is not process or thread"):
        ServerSettings(isolation="threads")
