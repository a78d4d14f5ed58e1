"""``fnrt job``: submit asynchronous jobs, follow them, fetch their results, cancel them."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click
from tqdm import tqdm

from fnrt.client import Client
from fnrt.functions.errors import FnrtError
from fnrt.runtime.cli.options import client_options, connect
from fnrt.runtime.settings import ClientSettings

_ENDED = ("done", "failed", "cancelled")


def is_store_ref(text: str) -> bool:
    """Whether ``--input`` names an object of the server's store (``s3://…``, ``file://…``
    or ``store:KEY``) rather than a local file."""
    return "://" in text or text.startswith("store:")


def describe_job(status: dict[str, Any]) -> str:
    """A job's status in a few lines."""
    p, t = status["progress"], status["timings"]
    lines = [
        f"job {status['id']}: {status['state']}"
        + (f" ({status['reason']})" if status.get("reason") else ""),
        f"  function {status['function']} {status['version']}",
        f"  records  {p['records_done']} of {p['records_total']} done, "
        f"{p['records_failed']} failed ({p['chunks_done']} of {p['chunks_total']} chunks)",
    ]
    timing = f"  queued   {t['queued_s']:.1f} s"
    if t.get("running_s") is not None:
        timing += f", ran {t['running_s']:.1f} s"
        if t["running_s"] > 0 and p["records_done"]:
            timing += f" ({p['records_done'] / t['running_s']:,.0f} records/s)"
    lines.append(timing)
    return "\n".join(lines)


def follow(server: Client, status: dict[str, Any], *, show_progress: bool = True) -> dict[str, Any]:
    """Wait for the job to end, with a bar of its records; its last status."""
    total = status["progress"]["records_total"]
    with tqdm(
        total=total,
        unit="rec",
        unit_scale=True,
        desc=f"job {status['id'][:13]}",
        disable=not show_progress,
        file=sys.stderr,
    ) as bar:

        def update(now: dict[str, Any]) -> None:
            bar.update(now["progress"]["records_done"] - bar.n)
            failed = now["progress"]["records_failed"]
            bar.set_postfix_str(f"{now['state']}" + (f", {failed} failed" if failed else ""))

        return server.wait_job(status["id"], poll_s=0.5, on_status=update)


@click.group(short_help="asynchronous jobs: batch predictions on idle capacity")
def job() -> None:
    """Asynchronous jobs: many records through a function at the lowest priority, from a
    queue in the store that every node takes chunks from. A job and its results stay in
    the store until removed (jobs/ID/). See docs/jobs.md."""


@job.command(short_help="queue a job of a record file")
@click.argument("name")
@click.option(
    "--input",
    "-i",
    "source",
    required=True,
    metavar="FILE|s3://…|store:KEY",
    help="the records: a local .jsonl, .msgpack or .npz file (uploaded), or an object "
    "already in the server's store (its s3:// or file:// URI, or store:KEY)",
)
@click.option("--chunk-records", type=click.IntRange(1, 100_000), help="records per chunk (1000)")
@click.option("--webhook", metavar="URL", help="POST the job's status here when it ends")
@click.option("--version", help="run this version (default: the one serving now)")
@click.option("--wait", is_flag=True, help="follow the job to its end, with a progress bar")
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON")
@client_options
def submit(
    name: str,
    source: str,
    chunk_records: int | None,
    webhook: str | None,
    version: str | None,
    wait: bool,
    as_json: bool,
    client: ClientSettings,
) -> int:
    """Queue a job of function NAME over the records in --input. Every record is
    checked against the function's inputs first: a bad one is refused, by its index
    (and line). Prints the job's id; `fnrt job status ID` follows it."""
    with connect(client) as server:
        if is_store_ref(source):
            ref = source.removeprefix("store:")
            status = server.submit_job(
                name, input=ref, chunk_records=chunk_records, webhook=webhook, version=version
            )
        else:
            path = Path(source)
            if not path.is_file():
                raise FnrtError(f"{source}: no such file")
            with tqdm(
                total=path.stat().st_size,
                unit="B",
                unit_scale=True,
                desc="upload",
                file=sys.stderr,
            ) as bar:
                status = server.submit_job(
                    name,
                    input=path,
                    chunk_records=chunk_records,
                    webhook=webhook,
                    version=version,
                    progress=bar.update,
                )
        if wait:
            status = follow(server, status)
    _show(status, as_json)
    return 0 if status["state"] != "failed" else 1


@job.command(short_help="a job's state and progress")
@click.argument("job_id", metavar="ID")
@click.option("--wait", is_flag=True, help="follow the job to its end, with a progress bar")
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON")
@client_options
def status(job_id: str, wait: bool, as_json: bool, client: ClientSettings) -> int:
    """Show job ID: its state (queued, running, done, failed, cancelled), records done
    and failed of the total, timings, and the version that runs it. Exits 1 for a
    failed job (as `submit --wait` does)."""
    with connect(client) as server:
        found = server.job(job_id)
        if wait and found["state"] not in _ENDED:
            found = follow(server, found)
    _show(found, as_json)
    return 0 if found["state"] != "failed" else 1


@job.command(short_help="download a finished job's results")
@click.argument("job_id", metavar="ID")
@click.option(
    "--output",
    "-o",
    "dest",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="where to write them: .jsonl (one line per record), .msgpack, or .npz (every "
    "record succeeded)",
)
@click.option("--wait", is_flag=True, help="wait for the job to end first")
@client_options
def get(job_id: str, dest: Path, wait: bool, client: ClientSettings) -> int:
    """Write job ID's results to a file, one per record in input order: its outputs,
    or the error that failed it."""
    with connect(client) as server:
        found = server.job(job_id)
        if wait and found["state"] not in _ENDED:
            found = follow(server, found)
        with tqdm(unit="B", unit_scale=True, desc="download", file=sys.stderr) as bar:
            written = server.download_job_result(job_id, dest, progress=bar.update)
    failed = found["progress"]["records_failed"]
    print(
        f"{dest}: {found['progress']['records_total']} records, {failed} failed ({written:,} bytes)"
    )
    return 0


@job.command(short_help="cancel a job")
@click.argument("job_id", metavar="ID")
@client_options
def cancel(job_id: str, client: ClientSettings) -> int:
    """Cancel job ID: chunks running finish, no other starts."""
    with connect(client) as server:
        found = server.cancel_job(job_id)
    print(describe_job(found))
    return 0


@job.command("ls", short_help="list jobs")
@click.option("--function", help="only this function's jobs")
@click.option("--limit", type=click.IntRange(1, 100), default=20, show_default=True)
@click.option("--after", metavar="ID", help="the page after this job")
@click.option("--json", "as_json", is_flag=True, help="the page as JSON")
@client_options
def ls(
    function: str | None, limit: int, after: str | None, as_json: bool, client: ClientSettings
) -> int:
    """List jobs, oldest first, a page at a time (admin)."""
    with connect(client) as server:
        page = server.jobs(function, limit, after)
    if as_json:
        print(json.dumps(page, indent=2))
        return 0
    rows = [("ID", "FUNCTION", "STATE", "DONE", "FAILED", "CREATED")]
    for s in page["jobs"]:
        p = s["progress"]
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(s["timings"]["created_unix_s"]))
        rows.append(
            (
                s["id"],
                s["function"],
                s["state"],
                f"{p['records_done']}/{p['records_total']}",
                str(p["records_failed"]),
                created,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if page.get("next"):
        print(f"more: --after {page['next']}")
    return 0


def _show(status: dict[str, Any], as_json: bool) -> None:
    print(json.dumps(status, indent=2) if as_json else describe_job(status))
