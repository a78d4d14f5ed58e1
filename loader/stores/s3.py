"""An object store in S3 or any S3-compatible service (MinIO, Ceph, moto), via boto3.

Credentials and region come the standard AWS ways (environment, config files,
instance roles). A custom endpoint (``--s3-endpoint`` / ``FNRT_S3_ENDPOINT``)
uses path-style addressing. Large objects download as parallel ranged GETs
and upload as multipart; transient errors are retried with backoff and
jitter, and a final failure is a StoreError naming the object.

Nothing waits on the store without a bound (docs/hardening.md): each connection
has ``connect_timeout_s``, each wait for bytes ``read_timeout_s``, and each
operation, retries included, ``deadline_s`` (a download: ``deadline_s`` without a
byte arriving, and ``download_deadline_s`` in all). A store that accepts
connections and never answers fails the operation with a StoreError naming the
store within its deadline.
"""

from __future__ import annotations

import builtins
import os
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from fnrt.functions.errors import StoreError
from fnrt.functions.extras import require
from fnrt.loader.retry import Deadline, RetryPolicy, retrying
from fnrt.loader.stores.base import KeyNotFound, PreconditionFailed, Progress, Written, check_key

T = TypeVar("T")
_STREAM_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class S3Config:
    """Transfer settings for an S3 store."""

    endpoint_url: str | None = None
    region: str | None = None
    part_size_bytes: int = 16 * 1024 * 1024
    concurrency: int = 8
    #: the longest a TCP connection to the store may take to open
    connect_timeout_s: float = 2.0
    #: the longest the store may stay silent while an answer is awaited or arrives
    read_timeout_s: float = 5.0
    #: one operation, retries included; a download: the longest without a byte arriving.
    #: A retry starts only if it could fail before it; the first attempt always runs,
    #: so an operation that hangs ends within max(deadline_s, connect + read timeouts).
    deadline_s: float = 15.0
    #: a whole download, however steadily its bytes arrive
    download_deadline_s: float = 1800.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if self.part_size_bytes < 5 * 1024 * 1024:
            raise ValueError("part_size_bytes: S3 parts are at least 5 MiB")
        if not 1 <= self.concurrency <= 64:
            raise ValueError("concurrency: must be from 1 to 64")
        for name in ("connect_timeout_s", "read_timeout_s", "deadline_s", "download_deadline_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0")

    @property
    def attempt_s(self) -> float:
        """The longest one request may take to fail against a store that hangs."""
        return self.connect_timeout_s + self.read_timeout_s


def _transient(exc: BaseException) -> bool:
    from botocore.exceptions import (
        ClientError,
        HTTPClientError,
        IncompleteReadError,
        ResponseStreamingError,
    )
    from botocore.exceptions import (
        ConnectionError as BotoConnectionError,
    )
    from urllib3.exceptions import HTTPError as Urllib3Error

    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        code = exc.response.get("Error", {}).get("Code", "")
        return int(status) >= 500 or code in ("SlowDown", "Throttling", "RequestTimeout")
    return isinstance(
        exc,
        BotoConnectionError
        | HTTPClientError
        | IncompleteReadError
        | ResponseStreamingError
        | Urllib3Error
        | ConnectionError
        | TimeoutError,
    )


class _Stopped(Exception):
    """A part of a download given up because another part failed for good."""


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, never empty (a timeout's message may be)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class S3Store:
    """Objects under ``s3://bucket/prefix``."""

    def __init__(self, bucket: str, prefix: str = "", config: S3Config | None = None) -> None:
        boto3 = require("boto3", "an s3:// store")
        Config = require("botocore.config", "an s3:// store").Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.config = config or S3Config()
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        boto_config = Config(
            # retries are ours (retry.py): one attempt each ("max_attempts": 1 would be
            # one retry more, each as long as a timeout)
            retries={"total_max_attempts": 1, "mode": "standard"},
            s3={"addressing_style": "path" if self.config.endpoint_url else "auto"},
            max_pool_connections=self.config.concurrency * 2,
            connect_timeout=self.config.connect_timeout_s,
            read_timeout=self.config.read_timeout_s,
        )
        self.client: Any = boto3.session.Session().client(
            "s3",
            endpoint_url=self.config.endpoint_url,
            region_name=self.config.region,
            config=boto_config,
        )
        self.requests: Counter[str] = Counter()
        self._counting = threading.Lock()
        self.client.meta.events.register("before-send.s3", self._count)

    def _count(self, event_name: str, **_: Any) -> None:
        """Count one HTTP request about to be sent (``before-send.s3.GetObject``...).
        Returns None: anything else would stand in for the response."""
        with self._counting:
            self.requests[event_name.rsplit(".", 1)[-1]] += 1

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _deadline(self) -> Deadline:
        return Deadline(self.config.deadline_s)

    def _call(
        self, what: str, key: str, op: Callable[[], T], deadline: Deadline | None = None
    ) -> T:
        deadline = deadline or self._deadline()
        try:
            return retrying(
                op,
                policy=self.config.retry,
                transient=_transient,
                deadline=deadline,
                attempt_s=self.config.attempt_s,
            )
        except (KeyNotFound, PreconditionFailed):
            raise
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "404", "NotFound"):
                raise KeyNotFound(self.uri, key) from None
            if _code(exc) in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise PreconditionFailed(
                    f"object '{key}' changed since it was read", key=key
                ) from None
            raise StoreError(
                f"{what} of {self.uri}/{key} failed after retries ({deadline.elapsed_s():.1f} s"
                f", store deadline {self.config.deadline_s:g} s): {describe(exc)}",
                key=key,
                store=self.uri,
            ) from exc

    def _read(self, body: Any, deadline: Deadline) -> bytes:
        """A response body read whole, within ``deadline`` however slowly it trickles."""
        parts = []
        while chunk := body.read(_STREAM_CHUNK):
            parts.append(chunk)
            if deadline.left_s() <= 0:
                raise TimeoutError("the store deadline passed while the answer arrived")
        return b"".join(parts)

    # --- ObjectStore -----------------------------------------------------------

    def get(self, key: str) -> tuple[bytes, str]:
        deadline = self._deadline()

        def op() -> tuple[bytes, str]:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            return self._read(response["Body"], deadline), str(response["ETag"]).strip('"')

        return self._call("GET", key, op, deadline)

    def get_if_changed(self, key: str, etag: str) -> tuple[bytes, str] | None:
        deadline = self._deadline()

        def op() -> tuple[bytes, str] | None:
            try:
                response = self.client.get_object(
                    Bucket=self.bucket, Key=self._key(key), IfNoneMatch=f'"{etag}"'
                )
            except Exception as exc:
                if _code(exc) in ("304", "NotModified"):
                    return None
                raise
            return self._read(response["Body"], deadline), str(response["ETag"]).strip('"')

        return self._call("GET", key, op, deadline)

    def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_absent: bool = False
    ) -> str:
        extra: dict[str, str] = {}
        if if_match is not None:
            extra["IfMatch"] = f'"{if_match}"'
        if if_absent:
            extra["IfNoneMatch"] = "*"

        def op() -> str:
            response = self.client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=data, **extra
            )
            return str(response["ETag"]).strip('"')

        return self._call("PUT", key, op)

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> None:
        with tempfile.NamedTemporaryFile(prefix="fnrt-s3-") as spool:
            for chunk in chunks:
                spool.write(chunk)
            spool.flush()
            self.put_file(key, Path(spool.name))

    def put_file(self, key: str, path: Path, progress: Progress | None = None) -> None:
        """Upload a file, multipart above one part size, parts in parallel."""
        from boto3.s3.transfer import TransferConfig

        transfer = TransferConfig(
            multipart_threshold=self.config.part_size_bytes,
            multipart_chunksize=self.config.part_size_bytes,
            max_concurrency=self.config.concurrency,
            use_threads=True,
        )

        deadline = Deadline(self.config.deadline_s, self.config.download_deadline_s)

        def moved(count: int) -> None:
            deadline.progressed()
            if progress is not None:
                progress(count)

        def op() -> None:
            self.client.upload_file(
                str(path), self.bucket, self._key(key), Config=transfer, Callback=moved
            )

        self._call("upload", key, op, deadline)

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except KeyNotFound:
            return False
        return True

    def size(self, key: str) -> int:
        def op() -> int:
            return int(
                self.client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"]
            )

        return self._call("HEAD", key, op)

    def list(self, prefix: str) -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        full, strip = base + prefix, len(base)

        def op() -> list[str]:
            keys: list[str] = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
            return sorted(keys)

        return self._call("LIST", prefix, op)

    def list_folders(
        self, prefix: str, after: str = "", limit: int | None = None
    ) -> builtins.list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        full = base + prefix

        def op() -> builtins.list[str]:
            names: builtins.list[str] = []
            # "~" sorts after every character of a key below a function folder
            extra = {"StartAfter": f"{full}{after}/~"} if after else {}
            paginator = self.client.get_paginator("list_objects_v2")
            pages = paginator.paginate(Bucket=self.bucket, Prefix=full, Delimiter="/", **extra)
            for page in pages:
                for common in page.get("CommonPrefixes", []):
                    names.append(common["Prefix"][len(full) : -1])
                    if limit is not None and len(names) >= limit:
                        return names
            return names

        return self._call("LIST", prefix, op)

    def delete(self, key: str) -> None:
        self._call(
            "DELETE", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        )

    def local_path(self, key: str) -> Path | None:
        return None

    def download(
        self,
        key: str,
        dest: Path,
        progress: Progress | None = None,
        written: Written | None = None,
    ) -> None:
        """Ranged GETs of ``part_size_bytes``, ``concurrency`` at a time, written in place;
        ``written`` is told of each part once it is all in.

        The first part's answer says the object's size (``Content-Range``), so no
        HEAD goes first: the bytes start to flow one round trip sooner. The parts
        share one deadline: ``deadline_s`` without a byte arriving, and
        ``download_deadline_s`` in all; a part that fails for good stops the others."""
        part = self.config.part_size_bytes
        lock = threading.Lock()
        deadline = Deadline(self.config.deadline_s, self.config.download_deadline_s)
        failed = threading.Event()

        def get(start: int, end: int) -> dict[str, Any]:
            return cast(
                dict[str, Any],
                self.client.get_object(
                    Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{end}"
                ),
            )

        def first() -> tuple[int, bool, dict[str, Any] | None]:
            """The object's size, whether the answer was a range, and the open answer
            for the first part (None: an empty object)."""
            try:
                response = get(0, part - 1)
            except Exception as exc:
                if _code(exc) == "InvalidRange":  # no byte 0: an empty object
                    return 0, True, None
                raise
            found = response.get("ContentRange")  # "bytes 0-5242879/12582935"
            if found:
                return int(found.rsplit("/", 1)[1]), True, response
            return int(response["ContentLength"]), False, response  # the whole object

        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            size, ranged, opened = self._call("GET", key, first, deadline)
            os.ftruncate(fd, size)

            def fetch(span: tuple[int, int], response: dict[str, Any] | None = None) -> None:
                start, end = span
                answers = [response] if response is not None else []

                def op() -> None:  # a retry GETs the range again
                    if failed.is_set():  # a part not started when another failed for good
                        raise _Stopped("another part of the download failed")
                    body = (answers.pop() if answers else get(start, end))["Body"]
                    offset = start
                    while chunk := body.read(_STREAM_CHUNK):
                        os.pwrite(fd, chunk, offset)
                        offset += len(chunk)
                        deadline.progressed()
                        if progress is not None:
                            with lock:
                                progress(len(chunk))
                        if failed.is_set():
                            raise _Stopped("another part of the download failed")
                        if deadline.left_s() <= 0:
                            raise TimeoutError("the download's deadline passed")
                    if offset != end + 1:
                        raise ConnectionError(f"range {start}-{end} ended at {offset}")
                    if written is not None:
                        written(start, offset)

                try:
                    self._call("GET", key, op, deadline)
                except BaseException:
                    failed.set()
                    raise

            if opened is None:
                return
            if not ranged:  # a server that ignored the range sent it all
                fetch((0, size - 1), opened)
                return
            ranges = [(start, min(start + part, size) - 1) for start in range(0, size, part)]
            if len(ranges) == 1:
                fetch(ranges[0], opened)
                return
            with ThreadPoolExecutor(min(self.config.concurrency, len(ranges))) as pool:
                done = [pool.submit(fetch, ranges[0], opened)]
                done += [pool.submit(fetch, span) for span in ranges[1:]]
                errors = [f.exception() for f in done]
            causes = [e for e in errors if e is not None]
            if causes:  # the part that failed first, not one it stopped
                raise next((e for e in causes if not isinstance(e.__cause__, _Stopped)), causes[0])
        finally:
            os.close(fd)

    def __repr__(self) -> str:
        return f"S3Store({self.uri})"
