"""A small HTTP client for the fnrt API, used by the CLI (and handy in scripts)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from fnrt.functions.codec import Format, decode, encode
from fnrt.functions.errors import FnrtError
from fnrt.functions.limits import UNBOUNDED
from fnrt.functions.version import VersionManifest
from fnrt.runtime.settings import ClientSettings

_CHUNK = 1024 * 1024


class RemoteError(FnrtError):
    """The server answered with an error status; ``status`` and its message."""

    def __init__(self, status: int, message: str, **fields: Any) -> None:
        super().__init__(message, status=status, **fields)
        self.status = status


class Client:
    """Talks to one fnrt server."""

    def __init__(self, settings: ClientSettings) -> None:
        headers = {"authorization": f"Bearer {settings.token}"} if settings.token else {}
        self.base_url = settings.server.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=settings.timeout_s
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise FnrtError(f"cannot reach the fnrt server at {self.base_url}: {exc}") from None
        if response.status_code >= 400:
            raise _remote_error(response)
        return response

    # --- blobs (a BlobSink, like Repository) ---------------------------------

    def has_blob(self, digest: str) -> bool:
        try:
            response = self._http.head(f"/v1/blobs/{digest}")
        except httpx.TransportError as exc:
            raise FnrtError(f"cannot reach the fnrt server at {self.base_url}: {exc}") from None
        if response.status_code == 404:
            return False
        if response.status_code >= 400:
            raise _remote_error(response)
        return True

    def put_blob(
        self, digest: str, source: Path | bytes, progress: Callable[[int], None] | None = None
    ) -> bool:
        response = self._send("PUT", f"/v1/blobs/{digest}", content=_stream(source, progress))
        return bool(response.json().get("created", False))

    # --- functions -----------------------------------------------------------

    def deploy(self, vm: VersionManifest, policy: str | None = None) -> dict[str, Any]:
        params = {"policy": policy} if policy else None
        return dict(self._send("POST", "/v1/functions", json=vm.to_dict(), params=params).json())

    def versions(self, name: str) -> dict[str, Any]:
        return dict(self._send("GET", f"/v1/functions/{name}/versions").json())

    def set_traffic(self, name: str, traffic: Mapping[str, int]) -> dict[str, Any]:
        body = {"traffic": dict(traffic)}
        return dict(self._send("PUT", f"/v1/functions/{name}/traffic", json=body).json())

    def rollback(self, name: str) -> dict[str, Any]:
        return dict(self._send("POST", f"/v1/functions/{name}/rollback").json())

    def failures(
        self, name: str, version: str | None = None, limit: int = 20, offset: int = 0
    ) -> dict[str, Any]:
        """One page of the kept failures (``next_offset`` says where the next starts)."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if version:
            params["version"] = version
        return dict(self._send("GET", f"/v1/functions/{name}/failures", params=params).json())

    def list(self) -> list[dict[str, Any]]:
        return list(self._send("GET", "/v1/functions").json()["functions"])

    def describe(self, name: str) -> dict[str, Any]:
        return dict(self._send("GET", f"/v1/functions/{name}").json())

    def delete(self, name: str) -> dict[str, Any]:
        return dict(self._send("DELETE", f"/v1/functions/{name}").json())

    def invoke(
        self,
        name: str,
        inputs: Mapping[str, Any],
        fmt: Format = Format.MSGPACK,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[dict[str, Any], Mapping[str, str]]:
        """Outputs (numpy arrays for msgpack, lists for JSON) and the response headers."""
        response = self._send(
            "POST",
            f"/v1/functions/{name}/invoke",
            content=encode(inputs, fmt, UNBOUNDED),
            headers={"content-type": fmt.media_type, "accept": fmt.media_type, **(headers or {})},
        )
        return decode(response.content, fmt, UNBOUNDED), response.headers


def _stream(source: Path | bytes, progress: Callable[[int], None] | None) -> Iterator[bytes]:
    chunks: Iterable[bytes]
    if isinstance(source, bytes):
        chunks = (source[i : i + _CHUNK] for i in range(0, len(source), _CHUNK))
    else:
        chunks = _file_chunks(source)
    for chunk in chunks:
        if progress is not None:
            progress(len(chunk))
        yield chunk


def _file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk


def _remote_error(response: httpx.Response) -> RemoteError:
    fields: dict[str, Any] = {}
    message = response.text or response.reason_phrase
    try:
        body = decode(
            response.content,
            Format.MSGPACK
            if "msgpack" in response.headers.get("content-type", "")
            else Format.JSON,
        )
    except FnrtError:
        body = {}
    if "error" in body:
        message = str(body.pop("error"))
        fields = {k: v for k, v in body.items() if k != "status"}
    return RemoteError(response.status_code, message, **fields)
