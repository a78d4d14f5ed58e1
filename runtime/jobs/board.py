"""The job board: asynchronous jobs as objects in the store every node shares.

Any node can take work and none holds what another needs: a job is its objects,
written with the store's conditional writes (a folder's lock, S3's ``If-Match``
/ ``If-None-Match``)::

    jobs/<id>/job.json        what was asked: function, version, counts (never changes)
    jobs/<id>/state.json      queued, running, done, failed or cancelled (conditional)
    jobs/<id>/in/<chunk>      a chunk's records (msgpack), written at submit
    jobs/<id>/lease/<chunk>   who runs the chunk, until when, which attempt (conditional)
    jobs/<id>/out/<chunk>     the chunk's results, in record order (written once)
    jobs/<id>/done/<chunk>    the chunk's outcome: records, failed (written once)
    jobqueue/<id>             present while the job waits or runs: what nodes list

A node takes a chunk by writing its lease: absent (``if_absent``) or expired
(``if_match`` on the expired one's ETag), so one node holds it at a time, and a
killed node's chunk is taken again once its lease runs out. Results are written
``if_absent``: a chunk run twice (a lease that ran out while its node was slow)
keeps the first results and never duplicates or loses a record. Progress is what
``done/`` lists; the node whose conditional write moves ``state.json`` to its end
is the one that calls the webhook.

Every method here is blocking store I/O (call it through ``asyncio.to_thread``).
The decisions (is a lease free, which state comes next) are pure functions of
the documents and the time.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import numpy as np
import orjson

from fnrt.functions.codec import decode_msgpack, encode_msgpack
from fnrt.functions.errors import BadRequest, Conflict, FnrtError, NotFound
from fnrt.functions.limits import UNBOUNDED
from fnrt.loader.stores.base import KeyNotFound, ObjectStore, PreconditionFailed

JOBS = "jobs/"
#: Chunks one job may have (a chunk is a few store requests: chunk_records bounds them).
MAX_CHUNKS = 10_000
#: Job specs a node keeps read (the most recently used).
SPECS_KEPT = 10_000
QUEUE = "jobqueue/"
#: A job id: 13 hex digits of the submit time in ms, then 12 random ones (ids sort by age).
ID_LENGTH = 25

Record = dict[str, Any]
#: One record's result: ``{"outputs": {name: array}}`` or ``{"error": {...}}``.
Outcome = dict[str, Any]


class JobState(Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


class JobNotFound(NotFound):
    def __init__(self, job: str) -> None:
        super().__init__(f"no job '{job}'", job=job)


def node_id() -> str:
    """This process's name in leases: host, pid and a random part (a restarted node
    with the same pid is still another holder)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def new_id(now_unix_s: float) -> str:
    return f"{int(now_unix_s * 1000):013x}{secrets.token_hex(6)}"


def is_id(text: str) -> bool:
    return len(text) == ID_LENGTH and all(c in "0123456789abcdef" for c in text)


def too_many_chunks(chunk_records: int) -> BadRequest:
    """Why a job of more than ``MAX_CHUNKS`` chunks of ``chunk_records`` is refused."""
    return BadRequest(
        f"a job has at most {MAX_CHUNKS} chunks: this one has more than "
        f"{MAX_CHUNKS * chunk_records} records; raise chunk_records",
        chunk_records=chunk_records,
    )


def _chunk_key(job: str, kind: str, chunk: int) -> str:
    return f"{JOBS}{job}/{kind}/{chunk:06d}"


@dataclass(frozen=True)
class JobSpec:
    """What a job asked for; written once at submit."""

    id: str
    function: str
    version: str
    records: int
    chunk_records: int
    created_unix_s: float
    source: str = "inline"  # or the store key the records were read from
    webhook: str | None = None

    @property
    def chunks(self) -> int:
        return math.ceil(self.records / self.chunk_records)

    def chunk_size(self, chunk: int) -> int:
        return min(self.chunk_records, self.records - chunk * self.chunk_records)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "function": self.function,
            "version": self.version,
            "records": self.records,
            "chunk_records": self.chunk_records,
            "created_unix_s": self.created_unix_s,
            "source": self.source,
            "webhook": self.webhook,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        return cls(**data)


@dataclass(frozen=True)
class StateDoc:
    """``state.json``: where the job is, and when it started and ended."""

    state: JobState = JobState.QUEUED
    started_unix_s: float | None = None
    finished_unix_s: float | None = None
    records_failed: int | None = None  # counted once, at the end
    reason: str | None = None  # why it failed or was cancelled

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "state": self.state.value,
                "started_unix_s": self.started_unix_s,
                "finished_unix_s": self.finished_unix_s,
                "records_failed": self.records_failed,
                "reason": self.reason,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> StateDoc:
        doc = orjson.loads(data)
        return cls(
            JobState(doc["state"]),
            doc.get("started_unix_s"),
            doc.get("finished_unix_s"),
            doc.get("records_failed"),
            doc.get("reason"),
        )


@dataclass(frozen=True)
class ChunkDone:
    """``done/<chunk>``: a finished chunk's counts."""

    records: int
    failed: int
    attempt: int
    node: str

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "records": self.records,
                "failed": self.failed,
                "attempt": self.attempt,
                "node": self.node,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> ChunkDone:
        return cls(**orjson.loads(data))


@dataclass(frozen=True)
class Lease:
    """A node's hold on one chunk until ``until_unix_s``; ``attempt`` counts the holds,
    ``reason`` why the last one gave the chunk back."""

    job: str
    chunk: int
    node: str
    until_unix_s: float
    attempt: int
    etag: str = ""
    reason: str | None = None

    def to_json(self) -> bytes:
        doc = {"node": self.node, "until_unix_s": self.until_unix_s, "attempt": self.attempt}
        if self.reason is not None:
            doc["reason"] = self.reason
        return orjson.dumps(doc)

    @classmethod
    def from_json(cls, job: str, chunk: int, data: bytes, etag: str) -> Lease:
        doc = orjson.loads(data)
        return cls(
            job,
            chunk,
            doc["node"],
            doc["until_unix_s"],
            doc["attempt"],
            etag,
            doc.get("reason"),
        )


def _first(*times: float | None) -> float:
    return next(t for t in times if t is not None)


def lease_free(lease: Lease | None, now_unix_s: float) -> bool:
    """Whether a chunk may be taken: nobody holds it, or the hold ran out."""
    return lease is None or lease.until_unix_s <= now_unix_s


def final_state(records: int, failed: int) -> JobState:
    """How a job whose every chunk is done ends: failed when no record succeeded."""
    return JobState.FAILED if records and failed >= records else JobState.DONE


@dataclass(frozen=True)
class JobStatus:
    """A job as ``GET /v1/jobs/{id}`` shows it."""

    spec: JobSpec
    state: StateDoc
    chunks_done: int
    records_done: int
    records_failed: int

    def to_dict(self, now_unix_s: float) -> dict[str, Any]:
        spec, state = self.spec, self.state
        started, finished = state.started_unix_s, state.finished_unix_s
        running_s = None
        if started is not None:
            running_s = round((finished if finished is not None else now_unix_s) - started, 3)
        return {
            "id": spec.id,
            "function": spec.function,
            "version": spec.version,
            "state": state.state.value,
            "reason": state.reason,
            "progress": {
                "records_total": spec.records,
                "records_done": self.records_done,
                "records_failed": self.records_failed,
                "chunks_total": spec.chunks,
                "chunks_done": self.chunks_done,
            },
            "timings": {
                "created_unix_s": spec.created_unix_s,
                "started_unix_s": started,
                "finished_unix_s": finished,
                "queued_s": round(_first(started, finished, now_unix_s) - spec.created_unix_s, 3),
                "running_s": running_s,
            },
            "source": spec.source,
            "chunk_records": spec.chunk_records,
            "webhook": spec.webhook,
        }


class DoneCounts:
    """The counts of finished chunks (they never change) of the jobs under way that this
    node follows, by job: read from the store once each; dropped when the job ends."""

    def __init__(self) -> None:
        self._by_job: dict[str, dict[int, ChunkDone]] = {}
        self._lock = threading.Lock()

    def of(self, job: str) -> dict[int, ChunkDone]:
        with self._lock:
            return dict(self._by_job.get(job, {}))

    def keep(self, job: str, counts: dict[int, ChunkDone]) -> None:
        with self._lock:
            self._by_job[job] = counts

    def forget(self, job: str) -> None:
        with self._lock:
            self._by_job.pop(job, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_job)


@dataclass
class JobBoard:
    """The jobs in one store, as one node reads and writes them."""

    store: ObjectStore
    node: str
    clock: Callable[[], float] = time.time  # wall time: leases are compared across nodes
    #: Specs read (they never change), the most recently used kept.
    _specs: OrderedDict[str, JobSpec] = field(default_factory=OrderedDict)
    #: Finished chunks' counts of the jobs still under way here.
    done_counts: DoneCounts = field(default_factory=DoneCounts)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- submit --------------------------------------------------------------------------

    def create(self, spec: JobSpec, records: Sequence[Record]) -> None:
        """Write a new job whose records are all at hand (see :meth:`write_chunks`)."""
        if len(records) != spec.records:
            raise ValueError(f"{len(records)} records for a job of {spec.records}")
        self.write_chunks(spec.id, iter(records), spec.chunk_records)
        self.publish(spec)

    def write_chunks(self, job: str, records: Iterator[Record], chunk_records: int) -> int:
        """Write a new job's records, a chunk as each fills (memory holds one chunk);
        how many there were. Nothing is queued yet: :meth:`publish` does that, and
        :meth:`discard` removes what was written when reading the records failed."""
        count = chunk = 0
        part: list[Record] = []
        for record in records:
            part.append(record)
            count += 1
            if len(part) == chunk_records:
                if chunk == MAX_CHUNKS:
                    raise too_many_chunks(chunk_records)
                self.store.put(_chunk_key(job, "in", chunk), encode_msgpack(_packed(part)))
                chunk, part = chunk + 1, []
        if part:
            if chunk == MAX_CHUNKS:
                raise too_many_chunks(chunk_records)
            self.store.put(_chunk_key(job, "in", chunk), encode_msgpack(_packed(part)))
        return count

    def discard(self, job: str) -> None:
        """Remove a job's folder: one never published, or one past its retention. Its
        state goes first, then what it asked: a reader that finds the state finds the
        folder whole (one cut off midway has no state, and the orphans' rule takes it)."""
        prefix = f"{JOBS}{job}/"
        first = [f"{prefix}state.json", f"{prefix}job.json"]
        for key in first:
            self.store.delete(key)
        for key in self.store.list(prefix):
            if key not in first:
                self.store.delete(key)

    def publish(self, spec: JobSpec) -> None:
        """Queue a job whose chunks are written: what it asked, its state, and last its
        place in the queue (so no node sees a job that is not whole)."""
        self.store.put(f"{JOBS}{spec.id}/job.json", orjson.dumps(spec.to_dict()), if_absent=True)
        self.store.put(f"{JOBS}{spec.id}/state.json", StateDoc().to_json(), if_absent=True)
        self.store.put(f"{QUEUE}{spec.id}", spec.function.encode())
        self._keep(spec)

    # --- reading -------------------------------------------------------------------------

    def spec(self, job: str) -> JobSpec:
        with self._lock:
            found = self._specs.get(job)
            if found is not None:
                self._specs.move_to_end(job)
                return found
        try:
            data, _ = self.store.get(f"{JOBS}{job}/job.json")
        except KeyNotFound:
            raise JobNotFound(job) from None
        spec = JobSpec.from_dict(orjson.loads(data))
        self._keep(spec)
        return spec

    def _keep(self, spec: JobSpec) -> None:
        with self._lock:
            self._specs[spec.id] = spec
            while len(self._specs) > SPECS_KEPT:
                self._specs.popitem(last=False)

    def state(self, job: str) -> tuple[StateDoc, str]:
        try:
            data, etag = self.store.get(f"{JOBS}{job}/state.json")
        except KeyNotFound:
            raise JobNotFound(job) from None
        return StateDoc.from_json(data), etag

    def done_chunks(self, job: str, *, keep: bool = True) -> dict[int, ChunkDone]:
        """The finished chunks of a job and their counts (each read once per node while
        the job is under way; ``keep`` False reads an ended job's without keeping them)."""
        known = self.done_counts.of(job)
        for key in self.store.list(f"{JOBS}{job}/done/"):
            chunk = int(key.rsplit("/", 1)[1])
            if chunk not in known:
                try:
                    known[chunk] = ChunkDone.from_json(self.store.get(key)[0])
                except KeyNotFound:
                    continue
        if keep:
            self.done_counts.keep(job, known)
        return known

    def status(self, job: str) -> JobStatus:
        """A job's status. An ended one's counts are in its state (a done job's are
        its spec's): no chunk is read for it."""
        spec = self.spec(job)
        state, _ = self.state(job)
        if state.state.final:
            self.done_counts.forget(job)  # nothing of it is read again here
            if state.records_failed is not None:  # done or failed: counted at the end
                return JobStatus(spec, state, spec.chunks, spec.records, state.records_failed)
        done = self.done_chunks(job, keep=not state.state.final)
        failed = sum(d.failed for d in done.values())
        return JobStatus(spec, state, len(done), sum(d.records for d in done.values()), failed)

    def queued(self) -> list[str]:
        """Jobs waiting or running, oldest first."""
        return [key[len(QUEUE) :] for key in self.store.list(QUEUE) if is_id(key[len(QUEUE) :])]

    def listing(self, after: str = "", limit: int = 100) -> list[str]:
        """A page of job ids (oldest first) after ``after``."""
        return self.store.list_folders(JOBS, after=after, limit=limit)

    # A chunk is the store's own object, its records checked one by one at the submit:
    # read back whole (a thousand images stack past one request's tensor limits).
    def chunk_inputs(self, job: str, chunk: int) -> list[Record]:
        data, _ = self.store.get(_chunk_key(job, "in", chunk))
        return _unpacked(decode_msgpack(data, UNBOUNDED), "records")

    def chunk_results(self, job: str, chunk: int) -> list[Outcome]:
        data, _ = self.store.get(_chunk_key(job, "out", chunk))
        stored = decode_msgpack(data, UNBOUNDED)
        if "columns" in stored:  # every record succeeded, outputs of one shape
            return [{"outputs": outputs} for outputs in _unpacked(stored, "results")]
        results: list[Outcome] = stored["results"]
        return results

    # --- leases --------------------------------------------------------------------------

    def lease(self, job: str, chunk: int) -> Lease | None:
        try:
            data, etag = self.store.get(_chunk_key(job, "lease", chunk))
        except KeyNotFound:
            return None
        return Lease.from_json(job, chunk, data, etag)

    def claim(self, job: str, lease_s: float, skip: Collection[int] = ()) -> Lease | None:
        """Take a chunk of ``job`` that is not done and not held (or held past its
        lease), and not in ``skip`` (those the caller still runs); None when there is
        none to take."""
        spec = self.spec(job)
        done = set(self.done_chunks(job))
        held = {int(k.rsplit("/", 1)[1]) for k in self.store.list(f"{JOBS}{job}/lease/")}
        open_chunks = [c for c in range(spec.chunks) if c not in done and c not in skip]
        # chunks nobody holds first, then the held ones whose lease may have run out
        for chunk in sorted(open_chunks, key=lambda c: c in held):
            taken = self._take(job, chunk, lease_s, chunk in held)
            if taken is not None:
                return taken
        return None

    def _take(self, job: str, chunk: int, lease_s: float, held: bool) -> Lease | None:
        key = _chunk_key(job, "lease", chunk)
        now = self.clock()
        current = self.lease(job, chunk) if held else None
        if held and current is None and self.store.exists(_chunk_key(job, "done", chunk)):
            return None  # finished between the listing and now
        if not lease_free(current, now):
            return None
        attempt = 1 if current is None else current.attempt + 1
        reason = None if current is None else current.reason
        lease = Lease(job, chunk, self.node, now + lease_s, attempt, reason=reason)
        try:
            if current is None:
                etag = self.store.put(key, lease.to_json(), if_absent=True)
            else:
                etag = self.store.put(key, lease.to_json(), if_match=current.etag)
        except PreconditionFailed:
            return None  # another node took it first
        if self.store.exists(_chunk_key(job, "done", chunk)):
            self._drop_lease(replace(lease, etag=etag))
            return None
        return replace(lease, etag=etag)

    def renew(self, lease: Lease, lease_s: float) -> Lease | None:
        """Hold the chunk ``lease_s`` longer; None when another node has taken it."""
        renewed = replace(lease, until_unix_s=self.clock() + lease_s)
        try:
            etag = self.store.put(
                _chunk_key(lease.job, "lease", lease.chunk), renewed.to_json(), if_match=lease.etag
            )
        except PreconditionFailed:
            return None
        return replace(renewed, etag=etag)

    def release(self, lease: Lease, reason: str, *, counted: bool = True) -> None:
        """Give a chunk back at once, saying why; any node may take it again. A failed
        run counts as an attempt; a node that stops (``counted`` False) does not."""
        attempt = lease.attempt if counted else lease.attempt - 1
        expired = replace(lease, until_unix_s=0.0, attempt=attempt, reason=reason)
        key = _chunk_key(lease.job, "lease", lease.chunk)
        with contextlib.suppress(PreconditionFailed):  # taken by another node already
            self.store.put(key, expired.to_json(), if_match=lease.etag)

    def _drop_lease(self, lease: Lease) -> None:
        self.store.delete(_chunk_key(lease.job, "lease", lease.chunk))

    # --- results -------------------------------------------------------------------------

    def finish_chunk(self, lease: Lease, results: Sequence[Outcome]) -> ChunkDone:
        """Write the chunk's results once: a second run of the chunk keeps the first's."""
        out = _chunk_key(lease.job, "out", lease.chunk)
        try:
            self.store.put(out, encode_msgpack(_packed_results(results)), if_absent=True)
        except PreconditionFailed:
            results = self.chunk_results(lease.job, lease.chunk)  # the first run's
        done = ChunkDone(len(results), count_failed(results), lease.attempt, self.node)
        key = _chunk_key(lease.job, "done", lease.chunk)
        with contextlib.suppress(PreconditionFailed):  # the first run's counts stand
            self.store.put(key, done.to_json(), if_absent=True)
        self._drop_lease(lease)
        return done

    def mark_running(self, job: str) -> None:
        """queued → running, at the first chunk a node takes."""
        self._move(
            job,
            lambda s: (
                replace(s, state=JobState.RUNNING, started_unix_s=self.clock())
                if s.state is JobState.QUEUED
                else None
            ),
        )

    def complete(self, job: str) -> JobStatus | None:
        """End the job when every chunk is done. The status when this call ended it
        (the caller sends the webhook), None when it is not done or another node ended it."""
        spec = self.spec(job)
        done = self.done_chunks(job)
        if len(done) < spec.chunks:
            return None
        records = sum(d.records for d in done.values())
        failed = sum(d.failed for d in done.values())
        now = self.clock()

        def end(state: StateDoc) -> StateDoc | None:
            if state.state.final:
                return None
            return replace(
                state,
                state=final_state(records, failed),
                started_unix_s=state.started_unix_s if state.started_unix_s is not None else now,
                finished_unix_s=now,
                records_failed=failed,
                reason="every record failed"
                if final_state(records, failed) is JobState.FAILED
                else None,
            )

        ended = self._move(job, end)
        self.done_counts.forget(job)  # ended here or by another node: read no more here
        if ended is None:
            return None
        self.store.delete(f"{QUEUE}{job}")
        return JobStatus(spec, ended, len(done), records, failed)

    def cancel(self, job: str, reason: str = "cancelled") -> JobStatus:
        """Stop a job at its next chunk; Conflict (409) when it has already ended."""
        self.spec(job)  # JobNotFound first
        now = self.clock()

        def cancelled(state: StateDoc) -> StateDoc | None:
            if state.state.final:
                raise Conflict(
                    f"job '{job}' is already {state.state.value}", job=job, state=state.state.value
                )
            return replace(state, state=JobState.CANCELLED, finished_unix_s=now, reason=reason)

        self._move(job, cancelled)
        self.store.delete(f"{QUEUE}{job}")
        return self.status(job)

    def forget(self, job: str) -> None:
        """Take an ended job off the queue (a cancelled one a node still listed)."""
        self.done_counts.forget(job)
        self.store.delete(f"{QUEUE}{job}")

    def _move(self, job: str, change: Callable[[StateDoc], StateDoc | None]) -> StateDoc | None:
        """Apply ``change`` to ``state.json`` with a conditional write, again on a race.
        None when ``change`` says there is nothing to do."""
        while True:
            state, etag = self.state(job)
            new = change(state)
            if new is None:
                return None
            try:
                self.store.put(f"{JOBS}{job}/state.json", new.to_json(), if_match=etag)
            except PreconditionFailed:
                continue
            return new


def failed_outcome(error: FnrtError | str, **fields: Any) -> Outcome:
    """A record's result when it could not be computed: the error, its type and fields."""
    if isinstance(error, FnrtError):
        return {"error": {"message": error.message, "type": type(error).__name__, **error.fields}}
    return {"error": {"message": error, **fields}}


def outcomes_failed(count: int, reason: str, **fields: Any) -> list[Outcome]:
    return [failed_outcome(reason, **fields) for _ in range(count)]


def ok_outcome(outputs: Any) -> Outcome:
    return {"outputs": dict(outputs)}


def count_failed(results: Iterable[Outcome]) -> int:
    return sum(1 for r in results if "error" in r)


# --- how chunks are stored ---------------------------------------------------------------
# A chunk whose records (or outputs) are arrays of one shape and dtype per name is
# stored as columns: one array per name, record i its row i. Reading or writing it is
# then a handful of objects whatever its length (in a thread, but holding the GIL
# that the event loop needs); other chunks are stored record by record.


def _packed(records: Sequence[Record]) -> dict[str, Any]:
    columns = _columns(records)
    return {"columns": columns} if columns is not None else {"records": list(records)}


def _packed_results(results: Sequence[Outcome]) -> dict[str, Any]:
    if all("outputs" in r for r in results):
        columns = _columns([r["outputs"] for r in results])
        if columns is not None:
            return {"columns": columns}
    return {"results": list(results)}


def _columns(rows: Sequence[Record]) -> dict[str, Any] | None:
    """``rows`` as one stacked array per name, or None when they do not stack (names,
    shapes or dtypes differ, or a value is not a numeric array)."""
    if not rows:
        return None
    first = rows[0]
    names = list(first)
    if any(len(row) != len(names) for row in rows):
        return None
    out: dict[str, Any] = {}
    for name in names:
        head = first[name]
        if not isinstance(head, np.ndarray) or head.dtype.kind not in "biufc":
            return None
        column = [row.get(name) for row in rows]
        if any(
            not isinstance(v, np.ndarray) or v.shape != head.shape or v.dtype != head.dtype
            for v in column
        ):
            return None
        out[name] = np.stack(column)  # type: ignore[arg-type]
    return out


def _unpacked(stored: dict[str, Any], key: str) -> list[Record]:
    columns = stored.get("columns")
    if columns is None:
        found: list[Record] = stored[key]
        return found
    count = len(next(iter(columns.values())))
    return [{name: column[i] for name, column in columns.items()} for i in range(count)]
