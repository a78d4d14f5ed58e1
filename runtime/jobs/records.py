"""A job's records: read from the formats a job takes and checked against the inputs
of the version that will run them.

A record is one request's inputs (``{name: array}``, what an invoke body holds).
A job brings them as:

- JSON Lines (``.jsonl``, ``application/x-ndjson``): one input map per line;
- a msgpack stream (``.msgpack``, ``application/vnd.fnrt.records+msgpack``): input
  maps one after another, arrays as an invoke's msgpack body carries them;
- ``.npz`` (``application/x-npz``): one array per input, record ``i`` being row
  ``i`` of each;
- a list in the submit body itself (``{"records": [...]}``, JSON or msgpack).

Everything is checked before the job is queued: a record that cannot be read is
a 400 and one that does not match the manifest a 422, both naming the record
(and its line, in JSON Lines).
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import msgpack
import numpy as np
import orjson

from fnrt.functions.codec import MalformedAt, iter_msgpack
from fnrt.functions.errors import (
    BadRecord,
    BadRequest,
    FnrtError,
    MalformedRecords,
    PayloadTooLarge,
)
from fnrt.functions.limits import TensorLimits
from fnrt.functions.manifest import TensorSpec
from fnrt.functions.records import (
    RecordFormat,
    format_of_media,
    format_of_name,
    negotiate_records,
)
from fnrt.functions.tensors import as_array, coerce_request

__all__ = [
    "Record",
    "RecordFormat",
    "check_records",
    "format_of_media",
    "format_of_name",
    "iter_records",
    "more_records_than",
    "negotiate_records",
    "read_records",
]

Record = dict[str, "np.ndarray[Any, Any]"]


def read_records(
    path: Path, fmt: RecordFormat, specs: Mapping[str, TensorSpec], limits: TensorLimits
) -> list[Record]:
    """Every record of the file at ``path``, checked against ``specs`` (see
    :func:`iter_records`)."""
    return list(iter_records(path, fmt, specs, limits))


def iter_records(
    path: Path,
    fmt: RecordFormat,
    specs: Mapping[str, TensorSpec],
    limits: TensorLimits,
    max_line_bytes: int = 8 << 20,
    max_npz_bytes: int = 1 << 30,
) -> Iterator[Record]:
    """The records of the file at ``path`` one at a time, each checked against
    ``specs`` (a job's chunks are written as they fill: memory holds a chunk, not the
    file). Raises MalformedRecords (400) or BadRecord (422) naming the first bad
    record, PayloadTooLarge (413) for a JSON line longer than ``max_line_bytes`` or
    an ``.npz`` whose arrays take more than ``max_npz_bytes`` once decompressed."""
    if fmt is RecordFormat.NPZ:
        yield from _npz(path, specs, max_npz_bytes)
        return
    with path.open("rb") as stream:
        if fmt is RecordFormat.JSONL:
            yield from _checked(_jsonl(stream, max_line_bytes), specs)
        else:
            yield from _checked(_msgpack(stream, limits), specs)


def more_records_than(path: Path, fmt: RecordFormat, limit: int) -> bool:
    """Whether the file at ``path`` surely holds more than ``limit`` records: looked at
    before anything of a job is written, far faster than reading it (newlines counted
    in blocks, msgpack objects skipped unbuilt, an ``.npz``'s first dimension from its
    headers). False when it does not, or when it is malformed: reading it says how."""
    try:
        if fmt is RecordFormat.NPZ:
            return _npz_rows(path) > limit
        with path.open("rb") as stream:
            if fmt is RecordFormat.JSONL:
                return _jsonl_more_than(stream, limit)
            unpacker = msgpack.Unpacker(stream, max_buffer_size=64 << 20)
            for _ in range(limit + 1):
                unpacker.skip()
            return True
    except (msgpack.OutOfData, FnrtError):
        return False
    except Exception:  # anything a malformed file raises: its reading names the record
        return False


def _jsonl_more_than(stream: Any, limit: int) -> bool:
    lines = 0
    last = b"\n"
    while block := stream.read(1 << 20):
        lines += block.count(b"\n")
        last = block[-1:]
    lines += last != b"\n"
    if lines <= limit:  # each record takes a line at least (blank lines are skipped)
        return False
    stream.seek(0)
    records = 0
    for line in stream:  # counted exactly: blank lines are no records
        records += bool(line.strip())
        if records > limit:
            return True
    return False


def _npz_rows(path: Path) -> int:
    """The first dimension of an ``.npz``'s first array, from its header (0 if none)."""
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            with archive.open(name) as member:
                shape, _ = _array_header(member)
            return int(shape[0]) if shape else 0
    return 0


def _array_header(member: IO[bytes]) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """The shape and dtype of a ``.npy`` file open at its start, from its header alone."""
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(member)
    else:
        shape, _, dtype = np.lib.format.read_array_header_2_0(member)
    return shape, dtype


def check_records(raw: Sequence[Any], specs: Mapping[str, TensorSpec]) -> list[Record]:
    """The records of a submit body's ``records`` list, checked against ``specs``."""
    return list(_checked(((i, None, r) for i, r in enumerate(raw)), specs))


def _checked(
    raw: Iterator[tuple[int, int | None, Any]], specs: Mapping[str, TensorSpec]
) -> Iterator[Record]:
    for index, line, obj in raw:
        if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
            kind = type(obj).__name__
            raise MalformedRecords(
                index, line, f"a record is a map of input name to tensor, not {kind}"
            )
        try:
            yield coerce_request(specs, obj)
        except FnrtError as exc:
            raise BadRecord(index, line, exc) from None


def _jsonl(stream: Any, max_line_bytes: int) -> Iterator[tuple[int, int | None, Any]]:
    index = 0
    number = 0
    while text := stream.readline(max_line_bytes + 1):
        number += 1
        if len(text) > max_line_bytes:
            raise LineTooLong(index, number, max_line_bytes)
        if not text.strip():
            continue
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise MalformedRecords(index, number, f"not valid JSON: {exc}") from None
        yield index, number, obj
        index += 1


def _msgpack(stream: Any, limits: TensorLimits) -> Iterator[tuple[int, int | None, Any]]:
    try:
        for index, obj in enumerate(iter_msgpack(stream, limits)):
            yield index, None, obj
    except MalformedAt as exc:
        raise MalformedRecords(exc.index, None, exc.reason) from None


#: What reading a malformed .npz raises: zipfile's own errors, and RuntimeError (an
#: encrypted member) or NotImplementedError (a compression method it lacks)
_UNREADABLE = (OSError, ValueError, zipfile.BadZipFile, EOFError, RuntimeError, NotImplementedError)


def _npz(path: Path, specs: Mapping[str, TensorSpec], max_bytes: int) -> Iterator[Record]:
    unpacked = _npz_bytes(path)
    if unpacked > max_bytes:  # a small compressed file can declare a huge array
        raise PayloadTooLarge(
            max_bytes, f"the .npz holds {unpacked} bytes of arrays once decompressed"
        )
    try:
        with np.load(path, allow_pickle=False) as archive:
            columns = {name: archive[name] for name in archive.files}
    except _UNREADABLE as exc:
        raise BadRequest(f"not a readable .npz file: {exc}") from None
    if not columns:
        raise BadRequest("the .npz file holds no arrays")
    lengths = {name: (a.shape[0] if a.ndim else None) for name, a in columns.items()}
    counts = set(lengths.values())
    if None in counts or len(counts) != 1:
        described = ", ".join(f"'{n}': {c}" for n, c in lengths.items())
        raise BadRequest(
            "every array of a .npz of records needs the same first dimension "
            f"(one row per record); got {described}"
        )
    (count,) = counts
    assert count is not None
    checked = _whole_columns(columns, specs)
    if checked is not None:  # one check a column: the rows are its views
        for i in range(count):
            yield {n: a[i] for n, a in checked.items()}
        return
    rows = ((i, None, {n: a[i] for n, a in columns.items()}) for i in range(count))
    yield from _checked(rows, specs)  # record by record: the first bad one is named


def _npz_bytes(path: Path) -> int:
    """What the arrays of an ``.npz`` take in memory, from their headers alone."""
    total = 0
    try:
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                with archive.open(name) as member:
                    shape, dtype = _array_header(member)
                total += math.prod(shape) * dtype.itemsize
    except _UNREADABLE as exc:
        raise BadRequest(f"not a readable .npz file: {exc}") from None
    return total


class LineTooLong(PayloadTooLarge):
    """A JSON line past the limit of an invoke's JSON body (413), named."""

    def __init__(self, record: int, line: int, limit_bytes: int) -> None:
        super().__init__(
            limit_bytes, f"record {record} (line {line}) is longer: a record is one invoke's body"
        )
        self.fields.update(record=record, line=line)


def _whole_columns(
    columns: Mapping[str, np.ndarray[Any, Any]], specs: Mapping[str, TensorSpec]
) -> dict[str, np.ndarray[Any, Any]] | None:
    """The columns converted as each row would be, when every row passes; None when
    some row does not (or the names differ)."""
    if specs and set(columns) != set(specs):
        return None
    try:
        converted = {n: as_array(n, c, specs.get(n)) for n, c in columns.items()}
    except FnrtError:
        return None
    for name, column in converted.items():
        spec = specs.get(name)
        if spec is not None and not spec.matches_shape(column.shape[1:]):
            return None
    return converted
