"""``fnrt versions``, ``fnrt traffic``, ``fnrt rollback``, ``fnrt failures``."""

from __future__ import annotations

import json
from typing import Any

import click

from fnrt.functions.errors import FnrtError
from fnrt.runtime.cli.options import client_options, connect
from fnrt.runtime.settings import ClientSettings


def parse_shares(items: list[str]) -> dict[str, int]:
    """``["v-a=90", "v-b=10"]`` -> ``{"v-a": 90, "v-b": 10}``; FnrtError when malformed."""
    shares: dict[str, int] = {}
    for item in items:
        version, sep, percent = item.partition("=")
        if not sep or not version or not percent.strip().isdigit():
            raise FnrtError(f"{item!r}: give each share as VERSION=PERCENT, e.g. v-3f1c0d2a9b7e=90")
        shares[version] = int(percent)
    if sum(shares.values()) != 100:
        raise FnrtError(f"shares must sum to 100, got {sum(shares.values())}")
    return shares


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def render_versions(listing: dict[str, Any]) -> str:
    rows: list[tuple[str, ...]] = [("VERSION", "SHARE", "STATE", "BREAKER", "REQUESTS", "CREATED")]
    for v in listing["versions"]:
        share = f"{v['share']}%"
        if "rollback_window_left_s" in v:
            share += f" (warm {v['rollback_window_left_s']:.0f}s)"
        rows.append(
            (v["version"], share, v["state"], v["breaker"], str(v["requests"]), v["created_at"])
        )
    out = _table(rows)
    rollout = listing.get("rollout")
    if rollout:
        out += f"\nrollout: {rollout.get('policy')} to {rollout.get('to')}: {rollout.get('state')}"
        if rollout.get("state") == "running":
            out += f" at {rollout.get('percent')}%"
        if rollout.get("reason"):
            out += f" ({rollout['reason']})"
    return out


@click.command(short_help="list a function's versions")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="the listing as JSON")
@client_options
def versions(name: str, as_json: bool, client: ClientSettings) -> int:
    """List every stored version of function NAME with its share of traffic, its
    state on the server (cold, loading, warm), its circuit breaker, and the rollout
    under way or last finished."""
    with connect(client) as server:
        listing = server.versions(name)
    print(json.dumps(listing, indent=2) if as_json else render_versions(listing))
    return 0


@click.command(short_help="split traffic between versions by hand")
@click.argument("name")
@click.argument("shares", nargs=-1, required=True, metavar="VERSION=PERCENT...")
@client_options
def traffic(name: str, shares: tuple[str, ...], client: ClientSettings) -> int:
    """Set function NAME's traffic split, e.g. `fnrt traffic mlp v-aaa=90 v-bbb=10`
    (shares in percent, summing to 100). Stops a canary under way."""
    split = parse_shares(list(shares))
    with connect(client) as server:
        result = server.set_traffic(name, split)
    print(", ".join(f"{v}={p}%" for v, p in result["traffic"].items()))
    return 0


@click.command(short_help="switch back to the previous version")
@click.argument("name")
@client_options
def rollback(name: str, client: ClientSettings) -> int:
    """Send all of function NAME's traffic back to the version served before the last
    cut-over: at once while it is still loaded (rollout.rollback_window_s, 600 s by
    default), otherwise it loads from the disk cache on its next request."""
    with connect(client) as server:
        result = server.rollback(name)
    print(f"{name}: all traffic to {result['version']}")
    return 0


@click.command(short_help="show failed requests kept for analysis")
@click.argument("name")
@click.option("--version", help="only this version")
@client_options
def failures(name: str, version: str | None, client: ClientSettings) -> int:
    """Print the newest failed requests of function NAME (error and inputs), as kept
    by its versions (breaker.failed_inputs_kept)."""
    with connect(client) as server:  # every page
        page = server.failures(name, version)
        kept = list(page["failures"])
        while page["next_offset"] is not None:
            page = server.failures(name, version, offset=page["next_offset"])
            kept += page["failures"]
    print(json.dumps({"name": name, "failures": kept}, indent=2))
    return 0


COMMANDS = (versions, traffic, rollback, failures)
