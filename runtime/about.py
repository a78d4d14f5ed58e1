"""What fnrt this is (``fnrt --version``, ``GET /v2``, ``/openapi.json``)."""

from __future__ import annotations

from importlib import metadata


def installed_version() -> str:
    """fnrt's installed version, or ``0+unknown`` when run from an uninstalled tree."""
    try:
        return metadata.version("fnrt")
    except metadata.PackageNotFoundError:
        return "0+unknown"
