"""Immutable version manifests: a manifest bound to the exact bytes it runs.

A version is the function's manifest plus the content digests of its code
bundle and of every artifact file. Its id is derived from that content alone,
so deploying the same folder twice gives the same version id, and a version id
names exactly one set of bytes on every node.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fnrt.functions.errors import FnrtError, ManifestError
from fnrt.functions.manifest import Manifest, parse_manifest

_DIGEST = re.compile(r"^[0-9a-f]{64}$")
#: The most module names a version's ``imports`` holds.
MAX_IMPORTS = 64


def check_digest(digest: str) -> str:
    """Return ``digest`` if it is 64 lowercase hex characters (a sha256)."""
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise FnrtError(f"{digest!r} is not a sha256 hex digest", digest=str(digest))
    return digest


def check_rel(rel: str) -> str:
    """Return ``rel`` if it is a plain relative path inside its folder: no absolute
    path, no ``..`` or ``.`` part, no empty part, no backslash or NUL. Raises
    ManifestError (422): a version whose artifact could write outside its tree."""
    parts = rel.split("/")
    if (
        not isinstance(rel, str)
        or rel.startswith("/")
        or "\\" in rel
        or "\0" in rel
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise ManifestError("artifacts", f"file {rel!r} is not a plain relative path")
    return rel


@dataclass(frozen=True)
class FileRef:
    """One stored file: where it sits inside its artifact, and its content."""

    rel: str  # "" for an artifact that is a single file
    digest: str
    size_bytes: int

    def __post_init__(self) -> None:
        check_digest(self.digest)
        if self.size_bytes < 0:
            raise ValueError("size_bytes must be >= 0")
        if self.rel:
            check_rel(self.rel)

    def to_dict(self) -> dict[str, Any]:
        return {"rel": self.rel, "digest": self.digest, "size_bytes": self.size_bytes}


@dataclass(frozen=True)
class ArtifactRef:
    """An artifact as deployed: a single file, or a folder of files."""

    path: str  # as written in the manifest, relative to the function folder
    is_dir: bool
    files: tuple[FileRef, ...]

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def digest(self) -> str:
        """The file's sha256; for a folder, the sha256 of its listing of names and digests."""
        if not self.is_dir:
            return self.files[0].digest
        listing = "\n".join(f"{f.rel}\0{f.digest}" for f in self.files)
        return hashlib.sha256(listing.encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "is_dir": self.is_dir,
            "files": [f.to_dict() for f in self.files],
        }

    def __post_init__(self) -> None:
        rels = [f.rel for f in self.files]
        if not self.is_dir and rels != [""]:
            raise ManifestError("artifacts", f"{self.path!r}: a file artifact is one file")
        if self.is_dir and ("" in rels or len(set(rels)) != len(rels)):
            raise ManifestError("artifacts", f"{self.path!r}: folder files need distinct names")

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> ArtifactRef:
        return ArtifactRef(
            path=str(data["path"]),
            is_dir=bool(data["is_dir"]),
            files=tuple(FileRef(**f) for f in data["files"]),
        )


@dataclass(frozen=True)
class VersionManifest:
    """Everything needed to load one version of a function, by content."""

    manifest: Manifest
    bundle: FileRef
    artifacts: Mapping[str, ArtifactRef] = field(default_factory=dict)
    created_at: str = ""  # informational; not part of the version id
    #: the packages its code imports, read at its deploy (a spare worker imports ahead
    #: those installed on its node: ``fnrt.loader.imports``); informational, not part
    #: of the version id
    imports: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.manifest.name

    @functools.cached_property
    def version(self) -> str:
        """``v-`` and the first 12 hex digits of the sha256 of the content."""
        return _digest_id(self._content())

    def blobs(self) -> list[FileRef]:
        """Every stored file this version needs: the bundle, then each artifact's files."""
        return [self.bundle, *(f for a in self.artifacts.values() for f in a.files)]

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.blobs())

    def _content(self) -> dict[str, Any]:
        stored: dict[str, Any] | None = self.__dict__.get("_stored")  # an older fnrt's
        if stored is not None:
            return stored
        return {
            "manifest": self.manifest.to_dict(),
            "bundle": self.bundle.to_dict(),
            "artifacts": {k: v.to_dict() for k, v in sorted(self.artifacts.items())},
        }

    def stamped(self, created_at: str, imports: tuple[str, ...]) -> VersionManifest:
        """This version with its informational fields set; one stored by an older fnrt
        keeps its id and its content as stored (see :meth:`from_dict`)."""
        out = replace(self, created_at=created_at, imports=imports)
        if "_stored" in self.__dict__:
            out.__dict__["version"] = self.__dict__["version"]
            out.__dict__["_stored"] = self.__dict__["_stored"]
        return out

    def to_dict(self) -> dict[str, Any]:
        out = {"version": self.version, "created_at": self.created_at, **self._content()}
        if self.imports:
            out["imports"] = list(self.imports)
        return out

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True).encode()

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> VersionManifest:
        """Parse stored or uploaded data; the manifest part is fully validated."""
        for key in ("manifest", "bundle", "artifacts"):
            if not isinstance(data.get(key, {}), Mapping):
                raise FnrtError(f"malformed version manifest: '{key}' must be an object")
        try:
            vm = VersionManifest(
                manifest=parse_manifest(data["manifest"]),
                bundle=FileRef(**data["bundle"]),
                artifacts={
                    str(k): ArtifactRef.from_dict(v)
                    for k, v in dict(data.get("artifacts", {})).items()
                },
                created_at=str(data.get("created_at", "")),
                imports=_imports(data.get("imports", [])),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, FnrtError):
                raise
            raise FnrtError(f"malformed version manifest: {exc!r}") from None
        missing = set(vm.manifest.artifacts) ^ set(vm.artifacts)
        if missing:
            raise FnrtError(
                f"version manifest artifacts do not match the manifest: {sorted(missing)}"
            )
        claimed = data.get("version")
        if claimed is not None and claimed != vm.version:
            stored = _stored_content(data)
            if stored is None or claimed != _digest_id(stored):
                raise FnrtError(f"version id {claimed!r} does not match its content ({vm.version})")
            # Stored by an older fnrt that wrote its content otherwise (whole numbers of
            # seconds as 300, not 300.0): the content as stored still hashes to the id it
            # claims, so the version keeps that id, and is written as it was stored.
            vm.__dict__["version"] = claimed
            vm.__dict__["_stored"] = stored
        return vm


def _imports(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_IMPORTS:
        raise FnrtError(
            f"malformed version manifest: 'imports' must be a list of at most {MAX_IMPORTS} "
            "module names"
        )
    for name in value:
        if not isinstance(name, str) or not name.isidentifier():
            raise FnrtError(f"malformed version manifest: {name!r} in 'imports' is not a name")
    return tuple(value)


def _digest_id(content: Mapping[str, Any]) -> str:
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return "v-" + hashlib.sha256(canonical.encode()).hexdigest()[:12]


def _stored_content(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """A stored version's content exactly as it was written (None if it lacks a part)."""
    try:
        return {
            "manifest": dict(data["manifest"]),
            "bundle": dict(data["bundle"]),
            "artifacts": dict(sorted(dict(data.get("artifacts", {})).items())),
        }
    except (KeyError, TypeError, ValueError):
        return None
