"""Server settings: the defaults, and the checks that refuse a bad value (the FNRT_*
variables are read by the CLI's options: tests/runtime/cli/test_serve.py)."""

from __future__ import annotations

import pytest

from fnrt.runtime.settings import ServerSettings


def test_isolation_defaults_to_process() -> None:
    assert ServerSettings().isolation == "process"


def test_an_unknown_isolation_is_refused() -> None:
    with pytest.raises(ValueError, match="isolation: 'threads' is not process or thread"):
        ServerSettings(isolation="threads")


def test_a_job_retention_is_zero_or_at_least_an_hour() -> None:
    assert ServerSettings().job_retention_s == 7 * 86_400
    assert ServerSettings(job_retention_s=0).job_retention_s == 0  # kept for good
    assert ServerSettings(job_retention_s=3600).job_retention_s == 3600
    for bad in (7.0, 3599.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match=r"job_retention_s: 0 .* or at least 1h"):
            ServerSettings(job_retention_s=bad)
