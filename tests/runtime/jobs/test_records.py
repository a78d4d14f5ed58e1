"""Reading a job's records: every format, and bad ones named by record and line."""

from __future__ import annotations

from pathlib import Path

import msgpack
import msgpack_numpy
import numpy as np
import pytest

from fnrt.functions.errors import (
    BadRecord,
    BadRequest,
    MalformedRecords,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from fnrt.functions.limits import DEFAULT_LIMITS
from fnrt.functions.manifest import TensorSpec
from fnrt.runtime.jobs.records import (
    RecordFormat,
    check_records,
    format_of_media,
    format_of_name,
    iter_records,
    more_records_than,
    negotiate_records,
    read_records,
)

SPECS = {"x": TensorSpec(dtype="float32", shape=(-1, 4))}


def _read(path: Path, fmt: RecordFormat) -> list[dict[str, np.ndarray]]:
    return read_records(path, fmt, SPECS, DEFAULT_LIMITS)


def test_json_lines_skip_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"x": [[1, 2, 3, 4]]}\n\n{"x": [[5, 6, 7, 8]]}\n')
    records = _read(path, RecordFormat.JSONL)
    assert len(records) == 2
    assert records[1]["x"].dtype == np.float32
    np.testing.assert_array_equal(records[1]["x"], [[5, 6, 7, 8]])


def test_a_msgpack_stream_of_input_maps(tmp_path: Path) -> None:
    path = tmp_path / "r.msgpack"
    with path.open("wb") as out:
        for i in range(3):
            x = np.full((1, 4), i, np.float32)
            out.write(msgpack.packb({"x": x}, default=msgpack_numpy.encode))
    records = _read(path, RecordFormat.MSGPACK)
    np.testing.assert_array_equal(records[2]["x"], np.full((1, 4), 2, np.float32))


def test_npz_rows_are_records(tmp_path: Path) -> None:
    path = tmp_path / "r.npz"
    np.savez(path, x=np.arange(24, dtype=np.float32).reshape(3, 2, 4)[:, :1, :])
    records = _read(path, RecordFormat.NPZ)
    assert len(records) == 3 and records[0]["x"].shape == (1, 4)


@pytest.mark.parametrize(
    ("text", "error", "record", "line", "words"),
    [
        ('{"x": [[1,2,3,4]]}\n\n{"x": [[1,2', MalformedRecords, 1, 3, "not valid JSON"),
        ('{"x": [[1,2,3,4]]}\n[1, 2]\n', MalformedRecords, 1, 2, "map of input name"),
        ('{"x": [[1,2,3,4]]}\n{"x": [[1,2,3]]}\n', BadRecord, 1, 2, "expected shape"),
        ('{"z": [[1,2,3,4]]}\n', BadRecord, 0, 1, "missing input 'x'"),
    ],
)
def test_a_bad_line_is_named(
    tmp_path: Path, text: str, error: type, record: int, line: int, words: str
) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(text)
    with pytest.raises(error, match=words) as raised:
        _read(path, RecordFormat.JSONL)
    assert raised.value.fields["record"] == record
    assert raised.value.fields["line"] == line
    assert f"record {record} (line {line})" in raised.value.message


def test_a_bad_msgpack_object_is_named_by_index(tmp_path: Path) -> None:
    path = tmp_path / "r.msgpack"
    good = msgpack.packb({"x": [[1.0, 2.0, 3.0, 4.0]]})
    path.write_bytes(good + good + msgpack.packb([1, 2]))
    with pytest.raises(MalformedRecords, match="record 2") as raised:
        _read(path, RecordFormat.MSGPACK)
    assert raised.value.fields == {"record": 2}


def test_npz_columns_must_agree(tmp_path: Path) -> None:
    path = tmp_path / "r.npz"
    np.savez(path, x=np.zeros((3, 1, 4), np.float32), w=np.zeros((2, 1), np.float32))
    with pytest.raises(BadRequest, match="same first dimension"):
        _read(path, RecordFormat.NPZ)
    path.write_bytes(b"not a zip")
    with pytest.raises(BadRequest, match=r"not a readable \.npz"):
        _read(path, RecordFormat.NPZ)


def test_inline_records_are_checked() -> None:
    assert len(check_records([{"x": [[1, 2, 3, 4]]}] * 2, SPECS)) == 2
    with pytest.raises(BadRecord, match="record 1: input 'x'") as raised:
        check_records([{"x": [[1, 2, 3, 4]]}, {"x": [[1]]}], SPECS)
    assert raised.value.fields["input"] == "x"


def test_formats_by_name_media_and_accept() -> None:
    assert format_of_name("data/in.JSONL") is RecordFormat.JSONL
    assert format_of_name("in.npz") is RecordFormat.NPZ
    with pytest.raises(BadRequest, match=r"\.jsonl, \.msgpack or \.npz"):
        format_of_name("in.csv")
    assert format_of_media("application/x-ndjson; charset=utf-8") is RecordFormat.JSONL
    assert format_of_media("application/json") is None
    assert negotiate_records(None) is RecordFormat.JSONL
    assert negotiate_records("application/msgpack") is RecordFormat.MSGPACK
    assert negotiate_records("text/csv, application/x-npz") is RecordFormat.NPZ
    with pytest.raises(UnsupportedMediaType):
        negotiate_records("text/csv")


def test_a_small_npz_that_declares_huge_arrays_is_refused_before_it_is_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, x=np.zeros((1 << 16, 1, 4), np.float32))  # 1 MiB of zeros
    assert path.stat().st_size < 20_000
    with pytest.raises(PayloadTooLarge, match="1048576 bytes of arrays"):
        list(iter_records(path, RecordFormat.NPZ, SPECS, DEFAULT_LIMITS, max_npz_bytes=1 << 19))
    assert len(list(iter_records(path, RecordFormat.NPZ, SPECS, DEFAULT_LIMITS))) == 1 << 16


def test_a_json_line_longer_than_an_invoke_body_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    long_line = '{"x": [[' + ", ".join(["1"] * 400) + "]]}"
    path.write_text('{"x": [[1, 2, 3, 4]]}\n' + long_line + "\n")
    with pytest.raises(PayloadTooLarge, match=r"record 1 \(line 2\)") as raised:
        list(iter_records(path, RecordFormat.JSONL, SPECS, DEFAULT_LIMITS, max_line_bytes=1024))
    assert raised.value.fields["record"] == 1 and raised.value.fields["line"] == 2


def test_more_records_than_counts_without_reading_the_records(tmp_path: Path) -> None:
    line = b'{"x": [[1, 2, 3, 4]]}\n'
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_bytes(line * 3 + b"\n\n\n" + line.rstrip())  # 4 records, 3 blank lines
    assert more_records_than(jsonl, RecordFormat.JSONL, 3)
    assert not more_records_than(jsonl, RecordFormat.JSONL, 4)
    assert not more_records_than(jsonl, RecordFormat.JSONL, 5)  # blank lines are no records
    packed = tmp_path / "r.msgpack"
    x = np.zeros((1, 4), np.float32)
    packed.write_bytes(msgpack.packb({"x": x}, default=msgpack_numpy.encode) * 4)
    assert more_records_than(packed, RecordFormat.MSGPACK, 3)
    assert not more_records_than(packed, RecordFormat.MSGPACK, 4)
    npz = tmp_path / "r.npz"
    np.savez(npz, x=np.zeros((4, 1, 4), np.float32))
    assert more_records_than(npz, RecordFormat.NPZ, 3)
    assert not more_records_than(npz, RecordFormat.NPZ, 4)
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"not a zip")
    assert not more_records_than(broken, RecordFormat.NPZ, 0)  # reading it will say why
