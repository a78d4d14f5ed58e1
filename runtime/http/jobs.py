"""Asynchronous jobs over HTTP: submit, status, results, cancel, list.

``POST /v1/functions/{name}/jobs`` takes the records inline (``{"records": [...]}``
in JSON or msgpack), as a record file in the body (JSON Lines, a msgpack stream or
``.npz``, by ``Content-Type``), or as a reference to an object in the store
(``{"input": "key"}`` or ``?input=key``). Every record is checked against the
version that will run it before the job is queued; the answer is 202 with the
job's id and ``Location``. ``GET /v1/jobs/{id}`` is its state and progress;
``GET /v1/jobs/{id}/result`` streams one result per record, in input order;
``DELETE /v1/jobs/{id}`` cancels it. See ``docs/jobs.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import orjson
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse

from fnrt.functions.codec import (
    Format,
    NotJsonNumber,
    NotJsonText,
    decode,
    encode_json,
    encode_msgpack,
    format_of,
)
from fnrt.functions.errors import (
    BadRequest,
    ClientLeft,
    Conflict,
    FnrtError,
    PayloadTooLarge,
    StoreError,
)
from fnrt.loader.stores.base import KeyNotFound, check_key
from fnrt.runtime.access import require_key
from fnrt.runtime.http.admin import admin, query_int
from fnrt.runtime.http.body import read_body
from fnrt.runtime.http.resource import resource
from fnrt.runtime.http.state import Node, node_of
from fnrt.runtime.jobs.board import (
    MAX_CHUNKS,
    JobNotFound,
    JobSpec,
    JobState,
    JobStatus,
    Record,
    StateDoc,
    is_id,
    new_id,
    too_many_chunks,
)
from fnrt.runtime.jobs.records import (
    RecordFormat,
    check_records,
    format_of_media,
    format_of_name,
    iter_records,
    more_records_than,
    negotiate_records,
)

#: Records per chunk (the unit a node leases and writes) unless the submit says.
DEFAULT_CHUNK_RECORDS = 1000
MAX_CHUNK_RECORDS = 100_000
MAX_WEBHOOK_CHARS = 2048
LIST_PAGE, LIST_PAGE_MAX = 20, 100
#: What fnrt keeps in the store (functions, blobs, jobs and their queue): never a job's input.
OWN_FOLDERS = frozenset({"functions", "blobs", "jobs", "jobqueue", "changes.json"})


async def submit(request: Request) -> Response:
    """Queue a job of the function's records (202, ``Location: /v1/jobs/{id}``)."""
    node = node_of(request)
    name = request.path_params["name"]
    headers = request.headers
    require_key(node.invoke_keys, name, headers)
    options: dict[str, Any] = dict(request.query_params)
    media = headers.get("content-type", "")
    record_format = format_of_media(media)
    spool: Path | None = None
    raw_records: list[Any] = []
    try:
        if record_format is not None:  # a record file as the body
            spool = await _spool(node, request)
            source = "body"
        else:
            fmt = format_of(media or None)
            body = await read_body(headers, request.receive, *_inline_limit(node, fmt))
            fields = await asyncio.to_thread(decode, body, fmt) if body else {}
            for key in ("chunk_records", "webhook", "version", "input"):
                if key in fields and key not in options:
                    options[key] = fields[key]
            listed = fields.get("records")
            source = "inline"
            if listed is None:
                ref = options.get("input")
                if not isinstance(ref, str) or not ref:
                    raise BadRequest(
                        'a job needs records: {"records": [...]}, a record file as the body '
                        '(JSON Lines, msgpack stream or .npz), or {"input": "<store key>"}'
                    )
                key = _store_key(node, ref)
                record_format = format_of_name(key)
                spool = await _fetch(node, key)
                source = key
            elif not isinstance(listed, list):
                raise BadRequest('"records" must be a list of input maps')
            else:
                raw_records = listed
        version = options.get("version")
        if version is not None and not isinstance(version, str):
            raise BadRequest("version must be a string")
        scheduler = await (
            node.registry.get_version(name, version) if version else node.registry.route(name)
        )
        vm = scheduler.version
        chunk_records = _chunk_records(options.get("chunk_records"))
        webhook = _webhook(options.get("webhook"))
        board = node.jobs.board
        now = board.clock()
        job = new_id(now)
        settings, specs = node.settings, vm.manifest.inputs

        left = threading.Event()  # the request was cancelled (its client left) meanwhile

        def write() -> JobStatus | None:  # in a thread: records read, checked, written
            most = MAX_CHUNKS * chunk_records  # refused before anything is written
            if spool is None:
                if len(raw_records) > most:
                    raise too_many_chunks(chunk_records)
                records = iter(check_records(raw_records, specs))
            else:
                assert record_format is not None
                if more_records_than(spool, record_format, most):
                    raise too_many_chunks(chunk_records)
                records = iter_records(
                    spool,
                    record_format,
                    specs,
                    settings.tensor_limits,
                    max_line_bytes=settings.json_body_limit,
                    max_npz_bytes=settings.max_job_bytes,
                )
            try:
                count = board.write_chunks(job, _until(left, records), chunk_records)
                if count:
                    # published here, not after the thread: a request cancelled while
                    # its records were written leaves no chunks that nothing queues
                    spec = JobSpec(
                        id=job,
                        function=vm.name,
                        version=vm.version,
                        records=count,
                        chunk_records=chunk_records,
                        created_unix_s=now,
                        source=source,
                        webhook=webhook,
                    )
                    board.publish(spec)
                    return JobStatus(spec, StateDoc(), 0, 0, 0)  # as queued, not read back
            except BaseException:
                with contextlib.suppress(Exception):  # the first error is the one to tell
                    board.discard(job)
                raise
            board.discard(job)  # no records
            return None

        try:
            queued = await asyncio.to_thread(write)
        except asyncio.CancelledError:
            left.set()
            raise
    finally:
        if spool is not None:
            spool.unlink(missing_ok=True)
    if queued is None:
        raise BadRequest("the job has no records")
    node.jobs.poke()
    # the status as queued, from what was written: a store that fails a read now would
    # answer 503 for a job that runs, and a client that retried would submit it twice
    return JSONResponse(
        queued.to_dict(now), status_code=202, headers={"location": f"/v1/jobs/{job}"}
    )


def _until(left: threading.Event, records: Iterator[Record]) -> Iterator[Record]:
    """``records`` until ``left`` is set (the submit was cancelled): ClientLeft then, and
    what was written is removed, not every chunk written first."""
    for record in records:
        if left.is_set():
            raise ClientLeft("the submit was cancelled while its records were written")
        yield record


def _inline_limit(node: Node, fmt: Format) -> tuple[int, str]:
    """A submit body's limit: an invoke's (JSON is parsed whole, holding the GIL); more
    records go as a file body, read record by record."""
    settings = node.settings
    hint = "send the records as a file body (application/x-ndjson, x-npz or msgpack stream)"
    if fmt is Format.JSON:
        return settings.json_body_limit, hint
    return settings.max_body_bytes, hint


async def _spool(node: Node, request: Request) -> Path:
    """The body, streamed to a file in the node's upload folder within ``max_job_bytes``."""
    limit = node.settings.max_job_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(limit, "a job's record file (--max-job-bytes)")
    path = _spool_path(node)
    received = 0
    try:
        with path.open("wb") as out:
            async for chunk in request.stream():
                received += len(chunk)
                if received > limit:
                    raise PayloadTooLarge(limit, "a job's record file (--max-job-bytes)")
                out.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def _spool_path(node: Node) -> Path:
    folder = Path(node.settings.cache_dir) / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    # the pid in the name: a node removes the spools of dead processes at start
    fd, name = tempfile.mkstemp(dir=folder, prefix=f"job.{os.getpid()}.")
    os.close(fd)
    return Path(name)


async def _fetch(node: Node, key: str) -> Path:
    """A store object, downloaded to a spool file; stopped (413) as soon as it passes
    ``max_job_bytes``, so a huge object cannot fill the node's disk."""
    path = _spool_path(node)
    limit = node.settings.max_job_bytes
    moved = 0

    def progress(count: int) -> None:
        nonlocal moved
        moved += count
        if moved > limit:
            raise PayloadTooLarge(limit, f"the store object '{key}'")

    try:
        await asyncio.to_thread(node.repository.store.download, key, path, progress)
        if path.stat().st_size > limit:  # a store whose download reports no progress
            raise PayloadTooLarge(limit, f"the store object '{key}'")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def _store_key(node: Node, ref: str) -> str:
    """A reference to an object of this node's store: a key, or the store's URI and a key."""
    uri = node.repository.store.uri.rstrip("/") + "/"
    if ref.startswith(uri):
        ref = ref[len(uri) :]
    elif "://" in ref:
        raise BadRequest(
            f"input {ref!r} is not in this server's store ({uri}): give a key in it",
            input=ref,
        )
    try:
        key = check_key(ref)
    except ValueError as exc:
        raise BadRequest(str(exc), input=ref) from None
    if key.split("/", 1)[0] in OWN_FOLDERS or key.startswith("."):
        raise BadRequest(
            f"input {ref!r} is in fnrt's own part of the store: put a job's records "
            "elsewhere (e.g. inputs/)",
            input=ref,
        )
    return key


def _chunk_records(value: Any) -> int:
    if value is None:
        return DEFAULT_CHUNK_RECORDS
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise BadRequest(f"chunk_records {value!r} is not an integer") from None
    if not 1 <= count <= MAX_CHUNK_RECORDS:
        raise BadRequest(f"chunk_records must be from 1 to {MAX_CHUNK_RECORDS}")
    return count


def _webhook(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > MAX_WEBHOOK_CHARS:
        raise BadRequest(
            f"webhook must be an http(s) URL of at most {MAX_WEBHOOK_CHARS} characters"
        )
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BadRequest(f"webhook {value!r} is not an http(s) URL")
    return value


def _job_id(request: Request) -> str:
    job: str = request.path_params["id"]
    if not is_id(job):
        raise BadRequest(f"{job!r} is not a job id", job=job)
    return job


async def _status(request: Request) -> JobStatus:
    """The job named by the path, once the caller may see its function."""
    node = node_of(request)
    status = await asyncio.to_thread(node.jobs.board.status, _job_id(request))
    require_key(node.invoke_keys, status.spec.function, request.headers)
    return status


async def get_job(request: Request) -> Response:
    """A job's state, progress (records done and failed of total), timings and version."""
    status = await _status(request)
    return JSONResponse(status.to_dict(node_of(request).jobs.board.clock()))


async def cancel_job(request: Request) -> Response:
    """Cancel a job: no chunk starts after this (409 when it has ended already)."""
    status = await _status(request)
    jobs = node_of(request).jobs
    cancelled = await jobs.cancel(status.spec.id)  # its webhook told, as an ended job's
    return JSONResponse(cancelled.to_dict(jobs.board.clock()))


#: The most jobs one page of ``GET /v1/jobs?function=`` looks at for its function's
LIST_SCAN = 1000


@admin
async def list_jobs(request: Request) -> Response:
    """Jobs a page at a time, oldest first: ``?limit=`` (default 20, at most 100) after
    ``?after=`` (the last id of the page before), ``?function=`` to keep one function's."""
    board = node_of(request).jobs.board
    limit = query_int(request, "limit", LIST_PAGE, 1, LIST_PAGE_MAX)
    after = request.query_params.get("after")
    if after is not None and not is_id(after):
        raise BadRequest(f"?after={after!r} is not a job id")
    function = request.query_params.get("function")
    statuses: list[JobStatus] = []
    last, scanned, more = after or "", 0, True
    # with ?function=, pages are read on until ``limit`` of its jobs (or LIST_SCAN jobs
    # looked at: ``next`` then says where to go on from)
    while more and len(statuses) < limit and scanned < LIST_SCAN:
        ids = await asyncio.to_thread(board.listing, last, limit - len(statuses))
        more = len(ids) == limit - len(statuses)
        for job in ids:
            with contextlib.suppress(FnrtError):  # a job being written or removed
                status = await asyncio.to_thread(board.status, job)
                if function is None or status.spec.function == function:
                    statuses.append(status)
        scanned += len(ids)
        last = ids[-1] if ids else last
    now = board.clock()
    shown = [s.to_dict(now) for s in statuses]
    return JSONResponse({"jobs": shown, "next": last if more else None})


async def get_result(request: Request) -> Response:
    """One result per record, in input order, as JSON Lines (the default), a msgpack
    stream or ``.npz`` (by ``Accept``). 409 until the job has ended."""
    status = await _status(request)
    state = status.state.state
    if not state.final:
        raise Conflict(
            f"job '{status.spec.id}' is {state.value} ({status.records_done} of "
            f"{status.spec.records} records done): its results come when it ends",
            job=status.spec.id,
            state=state.value,
        )
    fmt = negotiate_records(request.headers.get("accept"))
    board = node_of(request).jobs.board
    if fmt is RecordFormat.NPZ:  # written to a spool file, sent from there, removed
        node = node_of(request)
        path = _spool_path(node)
        try:
            await asyncio.to_thread(_npz, board, status, node.settings.max_job_bytes, path)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return FileResponse(
            path,
            media_type=fmt.media_type,
            headers=_result_headers(status, fmt),
            background=BackgroundTask(path.unlink, missing_ok=True),
        )
    # the first chunk before the answer starts: a store that fails is an error response
    first = await asyncio.to_thread(_chunk_or_none, board, status, 0) if status.spec.chunks else []
    return StreamingResponse(
        _stream(board, status, fmt, first),
        media_type=fmt.media_type,
        headers=_result_headers(status, fmt),
    )


def _result_headers(status: JobStatus, fmt: RecordFormat) -> dict[str, str]:
    name = f"{status.spec.function}-{status.spec.id}{fmt.suffix}"
    return {"content-disposition": f'attachment; filename="{name}"'}


async def _stream(
    board: Any, status: JobStatus, fmt: RecordFormat, first: list[dict[str, Any]] | None
) -> AsyncIterator[bytes]:
    """Each chunk's lines in turn (``first``: chunk 0's results, read already). A chunk
    that cannot be read past the first ends the answer unfinished (its client sees a
    truncated body, never made-up records)."""
    spec = status.spec
    for chunk in range(spec.chunks):
        if chunk == 0:
            results = first
        else:
            results = await asyncio.to_thread(_chunk_or_none, board, status, chunk)
        start = chunk * spec.chunk_records
        if results is None:
            results = [_not_run(status) for _ in range(spec.chunk_size(chunk))]
        lines = [_line(start + i, r, fmt) for i, r in enumerate(results)]
        yield b"".join(lines)


def _chunk_or_none(board: Any, status: JobStatus, chunk: int) -> list[dict[str, Any]] | None:
    """A chunk's results, or None for one an ended job never ran (it was cancelled, or
    failed, first). A store that fails, or a done job's chunk gone, raises: a record's
    result is never made up."""
    job = status.spec.id
    try:
        results: list[dict[str, Any]] = board.chunk_results(job, chunk)
    except KeyNotFound:
        gone = status.state.state is JobState.DONE  # every chunk of it was written
        if not gone:  # never ran, unless the job is being removed (its retention over)
            try:
                board.state(job)
            except JobNotFound:
                gone = True
        if gone:
            raise StoreError(
                f"the results of chunk {chunk} of job '{job}' are gone from the store",
                job=job,
                chunk=chunk,
            ) from None
        return None
    return results


def _not_run(status: JobStatus) -> dict[str, Any]:
    why = "cancelled" if status.state.state is JobState.CANCELLED else "not run"
    return {"error": {"message": f"the job was {why} before this record ran", "type": "NotRun"}}


def _line(index: int, result: Mapping[str, Any], fmt: RecordFormat) -> bytes:
    if fmt is RecordFormat.MSGPACK:
        return encode_msgpack({"index": index, **result})
    if "outputs" in result:
        try:
            outputs = encode_json(result["outputs"])
        except (NotJsonNumber, NotJsonText) as exc:
            error = {"message": exc.message, "type": type(exc).__name__}
            return orjson.dumps({"index": index, "error": error}) + b"\n"
        return b'{"index":%d,"outputs":%s}\n' % (index, outputs)
    return orjson.dumps({"index": index, "error": result["error"]}) + b"\n"


def _npz(board: Any, status: JobStatus, max_bytes: int, path: Path) -> None:
    """Write to ``path`` every output as one array, record ``i`` its row ``i``; only for
    a job whose every record succeeded with outputs of one shape and dtype, and whose
    arrays fit ``max_bytes`` (the node's ``--max-job-bytes``: they are built in memory,
    each row written once into its column)."""
    spec = status.spec
    if status.state.state is not JobState.DONE or status.records_failed:
        raise Conflict(
            f"job '{spec.id}' has records without results ({status.records_failed} failed, "
            f"state {status.state.state.value}): .npz holds whole columns only; ask for "
            "application/x-ndjson or application/vnd.fnrt.records+msgpack",
            job=spec.id,
        )
    columns: dict[str, np.ndarray[Any, Any]] = {}
    row = 0
    for chunk in range(spec.chunks):
        for result in board.chunk_results(spec.id, chunk):
            outputs = {name: np.asarray(v) for name, v in result["outputs"].items()}
            if not columns:  # the first record's outputs shape every column
                total = sum(v.nbytes for v in outputs.values()) * spec.records
                if total > max_bytes:
                    raise PayloadTooLarge(
                        max_bytes,
                        f"the outputs of job '{spec.id}' take {total} bytes as .npz arrays, more "
                        "than --max-job-bytes: ask for application/x-ndjson or "
                        "application/vnd.fnrt.records+msgpack (streamed)",
                    )
                columns = {
                    n: np.empty((spec.records, *v.shape), v.dtype) for n, v in outputs.items()
                }
            if outputs.keys() != columns.keys() or any(
                v.shape != columns[n].shape[1:] or v.dtype != columns[n].dtype
                for n, v in outputs.items()
            ):
                raise Conflict(
                    f"record {row}'s outputs differ in names, shape or dtype from record "
                    "0's: .npz holds one array per output; ask for JSON Lines"
                )
            for name, value in outputs.items():
                columns[name][row] = value
            row += 1
    with path.open("wb") as out:
        np.savez(out, **columns)  # type: ignore[arg-type]


routes = [
    resource("/v1/functions/{name}/jobs", post=submit),
    resource("/v1/jobs", get=list_jobs),
    resource("/v1/jobs/{id}", get=get_job, delete=cancel_job),
    resource("/v1/jobs/{id}/result", get=get_result),
]
