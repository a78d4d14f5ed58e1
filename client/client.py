"""The blocking client: invoke functions, and everything the ``fnrt`` CLI does."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from fnrt.client.calls import (
    DEFAULT_URL,
    FRAMES,
    LIST_PAGE,
    MSGPACK,
    Call,
    Event,
    Priority,
    error_of,
    invoke_call,
    list_call,
    read_frames,
    result_of,
    settle,
)
from fnrt.client.errors import NotFoundError
from fnrt.client.result import Result
from fnrt.client.retry import DEFAULT_RETRY, Attempts, RetryPolicy
from fnrt.functions.codec import Format, encode
from fnrt.functions.version import VersionManifest

_CHUNK_BYTES = 1024 * 1024


class Client:
    """Talks to one fnrt server over a pooled HTTP connection.

    >>> with Client("http://127.0.0.1:8000") as fnrt:
    ...     result = fnrt.invoke("mlp", x=np.ones((1, 16), np.float32))
    ...     result["y"], result.version

    ``token`` is sent as ``Authorization: Bearer`` (an admin token, or a function's
    invoke key). ``timeout_s`` bounds each call; ``retry`` says how 429 and 503
    answers are retried (idempotent calls only).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout_s: float = 300.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.retry = retry
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout_s, transport=transport
        )
        self._sleep = sleep
        self._rng = rng or random.Random()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- invoking -----------------------------------------------------------------------

    def invoke(
        self,
        name: str,
        /,
        inputs: Mapping[str, Any] | None = None,
        *,
        priority: Priority | None = None,
        deadline_s: float | None = None,
        version: str | None = None,
        sticky: str | None = None,
        timeout_s: float | None = None,
        idempotent: bool = True,
        format: Format = Format.MSGPACK,
        headers: Mapping[str, str] | None = None,
        **arrays: Any,
    ) -> Result:
        """Call function ``name`` with its inputs (``inputs=`` or keyword arrays).

        ``priority`` orders the function's queue; ``deadline_s`` is how long the
        request may wait there (it defaults to ``timeout_s``); ``version`` pins a
        stored version; ``sticky`` keeps one key on one version during a split;
        ``timeout_s`` bounds this call. Pass ``idempotent=False`` for a handler with
        side effects: it is then never sent twice.
        """
        call = invoke_call(
            name,
            {**arrays, **(inputs or {})},
            priority=priority,
            deadline_s=deadline_s,
            version=version,
            sticky=sticky,
            timeout_s=timeout_s,
            idempotent=idempotent,
            fmt=format,
            headers=headers,
        )
        return result_of(self._send(call))

    def generate(
        self,
        name: str,
        /,
        inputs: Mapping[str, Any],
        parameters: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Iterator[Event]:
        """Stream a generative function's answer (docs/generation.md): an
        :class:`Event` per chunk (``kind`` "chunk", ``data`` its outputs), then one
        "done" (``finish_reason``, ``usage``). An error before the first chunk raises
        as an invoke's would; one after it arrives as an "error" event."""
        sent = {"content-type": MSGPACK, "accept": FRAMES, **(headers or {})}
        asked = {**(parameters or {}), "stream": True}
        body = encode({**inputs, "parameters": asked}, Format.MSGPACK)
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
        path = f"/v1/functions/{name}/generate"
        with self._http.stream("POST", path, content=body, headers=sent, timeout=timeout) as r:
            if r.status_code >= 400:
                r.read()
                raise error_of(r)
            yield from read_frames(r.iter_bytes())

    # --- the server ---------------------------------------------------------------------

    def ready(self) -> bool:
        """Whether the server is ready to serve (``/readyz``)."""
        try:
            return self._http.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def list(self) -> list[dict[str, Any]]:
        """Every deployed function (a page at a time, as many pages as there are)."""
        found, cursor = [], None
        while True:
            page = self.list_page(cursor=cursor)
            found += page["functions"]
            cursor = page.get("next_cursor")
            if not cursor:
                return found

    def list_page(self, limit: int = LIST_PAGE, cursor: str | None = None) -> dict[str, Any]:
        """Up to ``limit`` functions after ``cursor`` (the last page's ``next_cursor``)."""
        return self._json(list_call(limit, cursor))

    def describe(self, name: str) -> dict[str, Any]:
        return self._json(Call("GET", f"/v1/functions/{name}", True))

    def versions(self, name: str) -> dict[str, Any]:
        return self._json(Call("GET", f"/v1/functions/{name}/versions", True))

    def failures(
        self, name: str, version: str | None = None, limit: int = 20, offset: int = 0
    ) -> dict[str, Any]:
        """One page of the kept failures (``next_offset`` says where the next starts)."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if version:
            params["version"] = version
        return self._json(Call("GET", f"/v1/functions/{name}/failures", True, params=params))

    # --- deploying (admin) --------------------------------------------------------------

    def deploy(self, version: VersionManifest, policy: str | None = None) -> dict[str, Any]:
        """Deploy a stored version (a ``VersionManifest``; its blobs already sent)."""
        params = {"policy": policy} if policy else None
        return self._json(
            Call("POST", "/v1/functions", False, params=params, json=version.to_dict())
        )

    def set_traffic(self, name: str, traffic: Mapping[str, int]) -> dict[str, Any]:
        body = {"traffic": dict(traffic)}
        return self._json(Call("PUT", f"/v1/functions/{name}/traffic", True, json=body))

    def rollback(self, name: str) -> dict[str, Any]:
        return self._json(Call("POST", f"/v1/functions/{name}/rollback", False))

    def delete(self, name: str) -> dict[str, Any]:
        return self._json(Call("DELETE", f"/v1/functions/{name}", False))

    def has_blob(self, digest: str) -> bool:
        try:
            self._send(Call("HEAD", f"/v1/blobs/{digest}", True))
        except NotFoundError:
            return False
        return True

    def put_blob(
        self, digest: str, source: Path | bytes, progress: Callable[[int], None] | None = None
    ) -> bool:
        """Send one content-addressed blob; whether it was new to the store."""
        call = Call("PUT", f"/v1/blobs/{digest}", False, content=_chunks(source, progress))
        return bool(self._json(call).get("created", False))

    # --- sending ------------------------------------------------------------------------

    def _json(self, call: Call) -> dict[str, Any]:
        return dict(self._send(call).json())

    def _send(self, call: Call) -> httpx.Response:
        attempts = Attempts(self.retry, call.idempotent, self._rng)
        while True:
            sent: httpx.Response | httpx.TransportError
            try:
                sent = self._http.send(call.request(self._http))
            except httpx.TransportError as exc:
                sent = exc
            step = settle(attempts, self.url, sent)
            if isinstance(step, httpx.Response):
                return step
            self._sleep(step)


def _chunks(source: Path | bytes, progress: Callable[[int], None] | None) -> Iterator[bytes]:
    pieces: Iterable[bytes]
    if isinstance(source, bytes):
        pieces = (source[i : i + _CHUNK_BYTES] for i in range(0, len(source), _CHUNK_BYTES))
    else:
        pieces = _file_chunks(source)
    for piece in pieces:
        if progress is not None:
            progress(len(piece))
        yield piece


def _file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while piece := f.read(_CHUNK_BYTES):
            yield piece
