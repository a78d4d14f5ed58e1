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
