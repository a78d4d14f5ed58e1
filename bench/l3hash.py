"""An L3 fetch hashed as its parts land, against the same fetch hashed after it.

    python bench/l3hash.py [--rounds 7] [--mib 256]

A blob of random bytes is put in an S3 endpoint (moto's server in its own
process on 127.0.0.1), then fetched into an empty disk cache (``BlobCache``,
as a cold start from L3 does) three ways, in interleaved rounds (every other
round in the reverse order):

- ``as parts land``: fnrt's way, each part hashed (sha256 and xxh3) once the
  parts before it are in (``integrity.Trailing``);
- ``after``: the same download with no parts reported, so the whole hash
  runs once the last byte has landed (what fnrt did before);
- ``boto3 tuned``: ``download_file`` with 16 threads and 16 MiB parts, which
  hashes nothing (the baseline of ``bench/coldstart.py``'s L3 figures).

It prints the medians of the whole fetch, its download and the hash left when
the download ended, and the ratios.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from loadgen import start_moto

MiB = 1024 * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args()
    keys = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
    os.environ.update(keys | {"AWS_DEFAULT_REGION": "us-east-1"})
    endpoint, moto = start_moto(dict(os.environ))
    work = Path(tempfile.mkdtemp(prefix="fnrt-l3hash-"))
    try:
        import boto3
        from boto3.s3.transfer import TransferConfig

        from fnrt.loader.cache import BlobCache, CacheConfig
        from fnrt.loader.repository import Repository, blob_key
        from fnrt.loader.stores.s3 import S3Config, S3Store

        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="bench")
        source = work / "source"
        source.write_bytes(os.urandom(args.mib * MiB))
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        repository = Repository(S3Store("bench", "fns", S3Config(endpoint_url=endpoint)))
        repository.put_blob(digest, source)
        tuned = TransferConfig(max_concurrency=16, multipart_chunksize=16 * MiB)
        rows: dict[str, list[tuple[float, float, float]]] = {}

        def fnrt(label: str, report: bool) -> None:
            cache = BlobCache(CacheConfig(work / "cache"))
            started = time.perf_counter()
            got = cache.get(
                digest,
                lambda tmp, written: repository.download_blob(
                    digest, tmp, written if report else None
                ),
            )
            whole = time.perf_counter() - started
            rows.setdefault(label, []).append((whole, got.fetch_s, got.verify_s))
            shutil.rmtree(work / "cache")

        def boto() -> None:
            dest = work / "download"
            started = time.perf_counter()
            s3.download_file("bench", "fns/" + blob_key(digest), str(dest), Config=tuned)
            rows.setdefault("boto3 tuned (no hash)", []).append(
                (time.perf_counter() - started, 0.0, 0.0)
            )
            dest.unlink()

        ways = [lambda: fnrt("as parts land", True), lambda: fnrt("after", False), boto]
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", flush=True)
            for way in ways if r % 2 == 0 else ways[::-1]:
                way()

        print(f"\n{args.mib} MiB from moto, {args.rounds} rounds (medians, s)")
        print(f"{'':<24} {'whole':>7} {'download':>9} {'hash left':>10}")
        med = {}
        for label, values in rows.items():
            med[label] = [statistics.median(v[i] for v in values) for i in range(3)]
            whole, fetch, left = med[label]
            print(f"{label:<24} {whole:>7.3f} {fetch:>9.3f} {left:>10.3f}")
        trail, after = med["as parts land"], med["after"]
        boto_s = med["boto3 tuned (no hash)"][0]
        print(f"\nwhole fetch, as parts land / after:     {trail[0] / after[0]:.2f}x")
        print(f"download alone, as parts land / after:  {trail[1] / after[1]:.2f}x")
        print(f"download vs boto3 tuned (speed):        {boto_s / trail[1]:.2f}x")
        print(f"whole fetch vs boto3 tuned (speed):     {boto_s / trail[0]:.2f}x")
    finally:
        moto.terminate()
        moto.wait(30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
