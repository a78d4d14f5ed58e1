"""The formats a job's records come in and its results go out in: by media type, by a
file's suffix, and by ``Accept``. Shared by the server (``fnrt.runtime.jobs``) and the
client, which names a file's type when it uploads it."""

from __future__ import annotations

from enum import Enum

from fnrt.functions.errors import BadRequest, UnsupportedMediaType


class RecordFormat(Enum):
    """A file of records, by its media type."""

    JSONL = "application/x-ndjson"
    MSGPACK = "application/vnd.fnrt.records+msgpack"
    NPZ = "application/x-npz"

    @property
    def media_type(self) -> str:
        return self.value

    @property
    def suffix(self) -> str:
        return _SUFFIXES_BY_FORMAT[self]


_MEDIA_TYPES = {
    "application/x-ndjson": RecordFormat.JSONL,
    "application/jsonl": RecordFormat.JSONL,
    "application/jsonlines": RecordFormat.JSONL,
    "application/vnd.fnrt.records+msgpack": RecordFormat.MSGPACK,
    "application/x-npz": RecordFormat.NPZ,
}
_SUFFIXES = {
    ".jsonl": RecordFormat.JSONL,
    ".ndjson": RecordFormat.JSONL,
    ".msgpack": RecordFormat.MSGPACK,
    ".mpk": RecordFormat.MSGPACK,
    ".npz": RecordFormat.NPZ,
}
_SUFFIXES_BY_FORMAT = {
    RecordFormat.JSONL: ".jsonl",
    RecordFormat.MSGPACK: ".msgpack",
    RecordFormat.NPZ: ".npz",
}


def format_of_media(media: str) -> RecordFormat | None:
    """The record format a media type names; None when it names none."""
    return _MEDIA_TYPES.get(media.split(";", 1)[0].strip().lower())


def format_of_name(name: str) -> RecordFormat:
    """The record format a file or store key is in, by its suffix."""
    for suffix, fmt in _SUFFIXES.items():
        if name.lower().endswith(suffix):
            return fmt
    raise BadRequest(
        f"cannot tell the format of {name!r}: name it .jsonl, .msgpack or .npz", input=name
    )


def negotiate_records(accept: str | None) -> RecordFormat:
    """The format results are sent in: the first that ``Accept`` names (JSON Lines for
    none, ``*/*`` or JSON)."""
    if not accept:
        return RecordFormat.JSONL
    for part in accept.split(","):
        media = part.split(";", 1)[0].strip().lower()
        if media in ("*/*", "application/*", "", "application/json"):
            return RecordFormat.JSONL
        if media in ("application/msgpack", "application/x-msgpack"):
            return RecordFormat.MSGPACK
        found = _MEDIA_TYPES.get(media)
        if found is not None:
            return found
    raise UnsupportedMediaType(
        f"cannot send results as {accept!r}: ask for "
        + ", ".join(f.media_type for f in RecordFormat),
        accept=accept,
    )
