"""``fnrt versions``, ``fnrt traffic``, ``fnrt rollback``, ``fnrt failures``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from fnrt.client import Client
from fnrt.functions.errors import FnrtError

ClientOf = Callable[[argparse.Namespace], Client]


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


def register(sub: Any, client_of: ClientOf, add_client_options: Callable[[Any], None]) -> None:
    def versions(args: argparse.Namespace) -> int:
        with client_of(args) as client:
            listing = client.versions(args.name)
        print(json.dumps(listing, indent=2) if args.json else render_versions(listing))
        return 0

    def traffic(args: argparse.Namespace) -> int:
        shares = parse_shares(args.shares)
        with client_of(args) as client:
            result = client.set_traffic(args.name, shares)
        print(", ".join(f"{v}={p}%" for v, p in result["traffic"].items()))
        return 0

    def rollback(args: argparse.Namespace) -> int:
        with client_of(args) as client:
            result = client.rollback(args.name)
        print(f"{args.name}: all traffic to {result['version']}")
        return 0

    def failures(args: argparse.Namespace) -> int:
        with client_of(args) as client:  # every page
            page = client.failures(args.name, args.version)
            kept = list(page["failures"])
            while page["next_offset"] is not None:
                page = client.failures(args.name, args.version, offset=page["next_offset"])
                kept += page["failures"]
        print(json.dumps({"name": args.name, "failures": kept}, indent=2))
        return 0

    p = sub.add_parser(
        "versions",
        help="list a function's versions",
        description="List every stored version of a function with its share of traffic, "
        "its state on the server (cold, loading, warm), its circuit breaker, and the "
        "rollout under way or last finished.",
    )
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    add_client_options(p)
    p.set_defaults(func=versions)

    p = sub.add_parser(
        "traffic",
        help="split traffic between versions by hand",
        description="Set a function's traffic split, e.g. `fnrt traffic mlp v-aaa=90 v-bbb=10` "
        "(shares in percent, summing to 100). Stops a canary under way.",
    )
    p.add_argument("name")
    p.add_argument("shares", nargs="+", metavar="VERSION=PERCENT")
    add_client_options(p)
    p.set_defaults(func=traffic)

    p = sub.add_parser(
        "rollback",
        help="switch back to the previous version",
        description="Send all traffic back to the version served before the last cut-over: "
        "at once while it is still loaded (rollout.rollback_window_s, 600 s by default), "
        "otherwise it loads from the disk cache on its next request.",
    )
    p.add_argument("name")
    add_client_options(p)
    p.set_defaults(func=rollback)

    p = sub.add_parser(
        "failures",
        help="show failed requests kept for analysis",
        description="Print the newest failed requests of a function (error and inputs), "
        "as kept by its versions (breaker.failed_inputs_kept).",
    )
    p.add_argument("name")
    p.add_argument("--version", help="only this version")
    add_client_options(p)
    p.set_defaults(func=failures)
