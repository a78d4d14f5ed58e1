"""The blocking client: invoke functions, and everything the ``fnrt`` CLI does."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
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
    job_options,
    list_call,
    read_frames,
    record_media,
    result_of,
    settle,
)
from fnrt.client.errors import NotFoundError
from fnrt.client.result import Result
from fnrt.client.retry import DEFAULT_RETRY, Attempts, RetryPolicy
from fnrt.functions.codec import Format, encode, iter_msgpack
from fnrt.functions.limits import UNBOUNDED
from fnrt.functions.records import RecordFormat
from fnrt.functions.version import VersionManifest

_CHUNK_BYTES = 1024 * 1024
#: A job's results as a msgpack stream, one map per record.
RECORDS = RecordFormat.MSGPACK.media_type


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
        with self._stream("POST", path, content=body, headers=sent, timeout=timeout) as r:
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

    # --- jobs ---------------------------------------------------------------------------

    def submit_job(
        self,
        name: str,
        records: Sequence[Mapping[str, Any]] | None = None,
        *,
        input: Path | str | None = None,
        chunk_records: int | None = None,
        webhook: str | None = None,
        version: str | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """Queue an asynchronous job of function ``name``: ``records`` (input maps, sent
        in the body), a local record file ``input`` (a ``Path``: .jsonl, .msgpack or .npz,
        streamed; ``progress`` is called with the bytes sent), or an object of the
        server's store (``input`` as a ``str`` key, or the store's URI and a key). The
        job's status, with its ``id``."""
        options = job_options(chunk_records, webhook, version)
        path = f"/v1/functions/{name}/jobs"
        if (records is None) == (input is None):
            raise ValueError("give records or input, not both or neither")
        if records is not None:
            body = encode({"records": list(records), **options}, Format.MSGPACK)
            call = Call("POST", path, False, headers={"content-type": MSGPACK}, content=body)
        elif isinstance(input, Path):
            headers = {"content-type": record_media(input.name)}
            call = Call(
                "POST",
                path,
                False,
                params=options,
                headers=headers,
                content=_chunks(input, progress),
            )
        else:
            call = Call("POST", path, False, json={"input": input, **options})
        return self._json(call)

    def job(self, job_id: str) -> dict[str, Any]:
        """A job's state, progress, timings and version."""
        return self._json(Call("GET", f"/v1/jobs/{job_id}", True))

    def jobs(
        self, function: str | None = None, limit: int = 20, after: str | None = None
    ) -> dict[str, Any]:
        """A page of jobs, oldest first (``next``: the ``after`` of the next page)."""
        params: dict[str, Any] = {"limit": limit}
        if function:
            params["function"] = function
        if after:
            params["after"] = after
        return self._json(Call("GET", "/v1/jobs", True, params=params))

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        """Cancel a job: no chunk starts after this."""
        return self._json(Call("DELETE", f"/v1/jobs/{job_id}", True))

    def wait_job(
        self,
        job_id: str,
        *,
        poll_s: float = 0.5,
        timeout_s: float | None = None,
        on_status: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll until the job ends (done, failed or cancelled); its last status.
        TimeoutError past ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            status = self.job(job_id)
            if on_status is not None:
                on_status(status)
            if status["state"] in ("done", "failed", "cancelled"):
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {status['state']}")
            self._sleep(poll_s)

    def job_results(self, job_id: str) -> Iterator[dict[str, Any]]:
        """A finished job's results in input order: ``{"index", "outputs"}`` (numpy
        arrays) or ``{"index", "error"}`` per record."""
        with self._stream("GET", f"/v1/jobs/{job_id}/result", headers={"accept": RECORDS}) as r:
            yield from iter_msgpack(_Pieces(r.iter_bytes()), UNBOUNDED)

    def download_job_result(
        self, job_id: str, dest: Path, progress: Callable[[int], None] | None = None
    ) -> int:
        """Write a finished job's results to ``dest`` in the format its suffix names
        (.jsonl, .msgpack or .npz); the bytes written."""
        media = record_media(dest.name)
        written = 0
        path = f"/v1/jobs/{job_id}/result"
        with self._stream("GET", path, headers={"accept": media}) as r:
            partial = dest.with_name(dest.name + ".part")
            with partial.open("wb") as out:
                for piece in r.iter_bytes():
                    out.write(piece)
                    written += len(piece)
                    if progress is not None:
                        progress(len(piece))
            partial.replace(dest)
        return written

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

    @contextmanager
    def _stream(self, method: str, path: str, **options: Any) -> Iterator[httpx.Response]:
        """An answer whose body is read as it arrives (``options``: httpx's); the typed
        error of an error answer is raised instead, its body read whole. Not retried."""
        with self._http.stream(method, path, **options) as r:
            if r.status_code >= 400:
                r.read()
                raise error_of(r)
            yield r

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


class _Pieces:
    """Bytes arriving in pieces, read as a file (for msgpack's unpacker)."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces = pieces
        self._held = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._held) < size:
            piece = next(self._pieces, None)
            if piece is None:
                break
            self._held += piece
        if size < 0:
            out, self._held = self._held, b""
        else:
            out, self._held = self._held[:size], self._held[size:]
        return out


def _file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while piece := f.read(_CHUNK_BYTES):
            yield piece
