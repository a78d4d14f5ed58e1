"""Who may call a function: optional invoke keys.

Invoke keys are optional. ``--invoke-keys-file`` names a JSON object of
function name to keys, ``"*"`` for keys every function takes:

    {"*": ["k-team"], "mlp": ["k-mlp-a", "k-mlp-b"]}

A function with keys (its own or server-wide) answers only requests with
``Authorization: Bearer <key>`` (the admin token also passes); others get 401.
Keys are compared in constant time. With no file the check costs one
attribute read per request.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from pathlib import Path

from fnrt.functions.errors import Unauthorized


class InvokeKeys:
    """Keys per function (``"*"``: every function), checked in constant time."""

    def __init__(self, keys: Mapping[str, list[str] | tuple[str, ...]], admin_token: str | None):
        for name, values in keys.items():
            if not isinstance(values, list | tuple) or not all(
                isinstance(v, str) and v for v in values
            ):
                raise ValueError(f"invoke keys of {name!r}: must be a list of non-empty strings")
        everywhere = tuple(keys.get("*", ()))
        self._keys = {name: tuple(values) + everywhere for name, values in keys.items()}
        self._everywhere = everywhere
        self._admin = admin_token

    @staticmethod
    def load(path: Path, admin_token: str | None) -> InvokeKeys:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"invoke keys file {path}: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"invoke keys file {path}: must be a JSON object")
        return InvokeKeys(data, admin_token)

    def keys_of(self, function: str) -> tuple[str, ...]:
        return self._keys.get(function, self._everywhere)

    def check(self, function: str, headers: Mapping[str, str]) -> None:
        """Raise Unauthorized (401) unless the request carries a key of ``function``."""
        keys = self.keys_of(function)
        if not keys:
            return
        scheme, _, given = headers.get("authorization", "").partition(" ")
        given = given.strip()
        ok = scheme.lower() == "bearer" and bool(given)
        matched = False
        for key in keys:  # every key compared: no early exit that times which matched
            matched |= hmac.compare_digest(given.encode(), key.encode())
        if self._admin is not None:
            matched |= hmac.compare_digest(given.encode(), self._admin.encode())
        if not (ok and matched):
            raise Unauthorized(f"function '{function}' needs 'Authorization: Bearer <key>'")


def require_key(keys: InvokeKeys | None, function: str, headers: Mapping[str, str]) -> None:
    """Raise Unauthorized (401) unless ``function`` takes calls without a key or
    ``headers`` carry one of its keys (``keys``: the node's, None with no keys file)."""
    if keys is not None:
        keys.check(function, headers)


def allows(keys: InvokeKeys | None, function: str, headers: Mapping[str, str]) -> bool:
    """Whether a caller with ``headers`` may call ``function`` (:func:`require_key`)."""
    try:
        require_key(keys, function, headers)
    except Unauthorized:
        return False
    return True
