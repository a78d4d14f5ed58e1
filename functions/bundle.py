"""Packing a function folder: the code bundle and the artifact files.

The code bundle is a gzip'd tar of the folder without its artifacts, written
deterministically (sorted names, zeroed times and owners) so the same code
always has the same digest. Artifacts are not copied into the bundle: each
artifact file is stored once as its own content-addressed blob.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fnrt.functions.errors import BadBundle, FnrtError, ManifestError
from fnrt.functions.manifest import Manifest
from fnrt.functions.version import ArtifactRef, FileRef, check_rel

#: Always left out of a bundle.
DEFAULT_EXCLUDE = (
    "__pycache__",
    "*.pyc",
    "*.pyo",
    ".*",
    "*.egg-info",
    "node_modules",
)
#: Code bundles hold code; anything bigger belongs in ``[artifacts]``.
MAX_BUNDLE_BYTES = 64 * 1024 * 1024
_CHUNK = 1024 * 1024


def file_digest(path: Path) -> str:
    """The sha256 hex digest of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class LocalFile:
    """A file in the function folder and the blob it becomes."""

    path: Path
    ref: FileRef


@dataclass(frozen=True)
class Bundle:
    """A packed function folder, ready to upload."""

    code: bytes
    code_ref: FileRef
    artifacts: dict[str, ArtifactRef]
    files: list[LocalFile]  # artifact files on disk, one per FileRef

    def blob_sources(self) -> Iterator[tuple[FileRef, Path | bytes]]:
        """Each blob with where its bytes come from (the code is in memory)."""
        yield self.code_ref, self.code
        for f in self.files:
            yield f.ref, f.path


def _excluded(rel: Path, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(part, p) for part in rel.parts for p in patterns) or any(
        fnmatch.fnmatch(rel.as_posix(), p) for p in patterns
    )


def _code_files(folder: Path, manifest: Manifest) -> list[Path]:
    artifact_paths = [Path(rel) for rel in manifest.artifacts.values()]
    patterns = DEFAULT_EXCLUDE + manifest.exclude
    rollout = manifest.rollout
    kept = {Path(rel) for rel in (rollout.warmup_file, rollout.probe_file) if rel}
    found: list[Path] = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if not path.is_file() or (_excluded(rel, patterns) and rel not in kept):
            continue
        if any(rel == a or a in rel.parents for a in artifact_paths):
            continue
        found.append(rel)
    return found


def pack_code(folder: Path, manifest: Manifest) -> bytes:
    """A deterministic ``.tar.gz`` of the folder's code (artifacts left out)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for rel in _code_files(folder, manifest):
            data = (folder / rel).read_bytes()
            info = tarfile.TarInfo(rel.as_posix())
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    if raw.tell() > MAX_BUNDLE_BYTES:
        raise FnrtError(
            f"the code in {folder} is over {MAX_BUNDLE_BYTES // 2**20} MiB: "
            "declare large files under [artifacts] or list them in 'exclude'"
        )
    return gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)


def _artifact(folder: Path, rel: str) -> tuple[ArtifactRef, list[LocalFile]]:
    root = folder / rel
    if root.is_dir():
        paths = sorted(p for p in root.rglob("*") if p.is_file())
        files = [
            LocalFile(p, FileRef(p.relative_to(root).as_posix(), file_digest(p), p.stat().st_size))
            for p in paths
        ]
        return ArtifactRef(rel, True, tuple(f.ref for f in files)), files
    single = LocalFile(root, FileRef("", file_digest(root), root.stat().st_size))
    return ArtifactRef(rel, False, (single.ref,)), [single]


def pack(folder: Path, manifest: Manifest) -> Bundle:
    """Pack ``folder`` for ``manifest``: the code bundle and every artifact's refs."""
    code = pack_code(folder, manifest)
    code_ref = FileRef("", hashlib.sha256(code).hexdigest(), len(code))
    artifacts: dict[str, ArtifactRef] = {}
    files: list[LocalFile] = []
    for key, rel in sorted(manifest.artifacts.items()):
        ref, local = _artifact(folder, rel)
        artifacts[key] = ref
        files.extend(local)
    return Bundle(code, code_ref, artifacts, files)


#: The most a code bundle may unpack to (code, not weights: those are artifacts).
MAX_CODE_BYTES = 256 * 1024 * 1024


def unpack_code(code: bytes, dest: Path, max_bytes: int = MAX_CODE_BYTES) -> None:
    """Extract a code bundle into ``dest``: regular files and folders only, every name
    a plain relative path, at most ``max_bytes`` in all. Raises BadBundle (400) naming
    the entry at fault before anything is written."""
    try:
        tar = tarfile.open(fileobj=io.BytesIO(code), mode="r:gz")  # noqa: SIM115 (closed below)
        members = tar.getmembers()
    except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise BadBundle(f"it is not a readable .tar.gz ({exc})") from None
    with tar:
        total = 0
        for member in members:
            if not (member.isfile() or member.isdir()):
                raise BadBundle(f"entry {member.name!r} is not a regular file or folder")
            try:
                check_rel(member.name.rstrip("/"))
            except ManifestError:
                raise BadBundle(f"entry {member.name!r} is not a plain relative path") from None
            total += member.size
            if total > max_bytes:
                raise BadBundle(f"it unpacks to more than {max_bytes} bytes")
        tar.extractall(dest, members=members, filter="data")
