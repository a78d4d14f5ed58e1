"""The scrub of mapped weight files: a stat finds writes, the paced xxh3 reading finds
what a stat cannot (loader/scrub.py), on real files."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import xxhash

from fnrt.loader.integrity import identity
from fnrt.loader.scrub import Mapped, Scrubber, ScrubConfig, pause_s

MiB = 1 << 20


def _mapped(path: Path, data: bytes, xxh3: str | None = None) -> Mapped:
    path.write_bytes(data)
    return Mapped(path, "d" * 64, identity(path), xxh3 or xxhash.xxh3_128_hexdigest(data))


def test_a_write_with_the_mtime_put_back_is_found_by_a_stat(tmp_path: Path) -> None:
    scrubber = Scrubber()
    watch = scrubber.watch([_mapped(tmp_path / "w", b"\x07" * MiB)])
    found: list[str] = []
    watch.on_change = found.append
    assert watch.check() is None
    st = (tmp_path / "w").stat()
    with (tmp_path / "w").open("r+b") as f:
        f.write(b"\xc8" * 16384)
    os.utime(tmp_path / "w", ns=(st.st_atime_ns, st.st_mtime_ns))
    scrubber.stat_all()
    assert watch.reason is not None and "identity changed" in watch.reason
    assert found == [watch.reason]  # told once
    assert watch.check() == watch.reason


def test_content_the_identity_cannot_see_is_found_by_reading(tmp_path: Path) -> None:
    """A file whose bytes differ from what was verified while its identity is the one
    recorded (bits flipped on the disk, say): only reading it finds that."""
    scrubber = Scrubber(ScrubConfig(rate_bytes_s=MiB))
    good = scrubber.watch([_mapped(tmp_path / "good", b"\x01" * (3 * MiB))])
    bad = scrubber.watch([_mapped(tmp_path / "bad", b"\x02" * (3 * MiB), xxh3="0" * 32)])
    assert good.check() is None and bad.check() is None  # a stat sees nothing
    read = 0
    while scrubber.rounds == 0:
        step = scrubber.read_some(MiB)  # a MiB at a time, as paced
        assert 0 < step <= MiB
        read += step
    assert read >= 6 * MiB and scrubber.files_read == 2  # each read whole once
    assert bad.reason is not None and "differs from what was verified" in bad.reason
    assert good.reason is None


def test_an_instance_unwatched_is_no_longer_read(tmp_path: Path) -> None:
    scrubber = Scrubber()
    watch = scrubber.watch([_mapped(tmp_path / "w", b"x" * 100)])
    watch.close()
    assert scrubber.read_some(MiB) == 0


def test_the_thread_finds_a_change_within_its_interval(tmp_path: Path) -> None:
    scrubber = Scrubber(ScrubConfig(interval_s=0.05, rate_bytes_s=64 * MiB))
    watch = scrubber.watch([_mapped(tmp_path / "w", b"\x07" * MiB)])
    found = threading.Event()
    watch.on_change = lambda _: found.set()
    scrubber.start()
    try:
        (tmp_path / "w").write_bytes(b"\x08" * MiB)
        assert found.wait(5)
    finally:
        scrubber.close()


def test_pacing_and_bounds() -> None:
    assert pause_s(64 * MiB, 64 * MiB, 0.25) == pytest.approx(0.75)
    assert pause_s(MiB, 64 * MiB, 1.0) == 0.0
    with pytest.raises(ValueError, match="interval_s"):
        ScrubConfig(interval_s=0)
    with pytest.raises(ValueError, match="rate_bytes_s"):
        ScrubConfig(rate_bytes_s=-1)


class _RemovedAfterListing(Scrubber):
    """A scrubber whose next listing of the watched files is followed, before any is
    read, by ``remove`` (the race made to happen, every time)."""

    remove: list[Path]

    def _files(self) -> list[Mapped]:
        files = super()._files()
        for path in self.remove:
            path.unlink()
        self.remove = []
        return files


@pytest.mark.parametrize("half_read", [False, True], ids=["unread", "half-read"])
def test_a_blob_removed_between_listing_and_reading_is_skipped(
    tmp_path: Path, half_read: bool
) -> None:
    """A watched blob removed after the scrub listed the files and before it read them:
    skipped, not recreated, nothing raised, and the other files are read on as before;
    the stat is what finds a removal. (This passed before: it guards the skip.)"""
    scrubber = _RemovedAfterListing(ScrubConfig(rate_bytes_s=MiB))
    scrubber.remove = []
    gone, kept = tmp_path / "a", tmp_path / "b"
    gone_watch = scrubber.watch([_mapped(gone, b"\x01" * (2 * MiB))])
    kept_watch = scrubber.watch([_mapped(kept, b"\x02" * MiB)])
    if half_read:
        assert scrubber.read_some(MiB) == MiB  # half of "a", read on at the next call
    scrubber.remove = [gone]
    read = scrubber.read_some(4 * MiB)
    assert read == MiB and scrubber.files_read == 1  # "b" alone, whole
    assert not gone.exists()
    assert kept_watch.reason is None and gone_watch.reason is None  # nothing read differs
    assert scrubber.read_some(4 * MiB) >= MiB and scrubber.files_read >= 2  # "b" again
    assert not gone.exists()
    assert gone_watch.check() is not None  # the stat: the file is not what was verified
    assert kept_watch.check() is None
