"""``fnrt describe``'s human summary of a function: what it is, how it is doing.

A pure function of the server's describe document (``--json`` prints that whole).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

#: Width of the label column.
_LABEL = 12


def describe_text(d: Mapping[str, Any]) -> str:
    """The summary of one function's describe document, one fact a line."""
    manifest: Mapping[str, Any] = d.get("manifest") or {}
    inst: Mapping[str, Any] = d.get("instance") or {}
    lines = [f"{d['name']}  {d['version']}  {_state(inst)}"]

    def row(label: str, text: str) -> None:
        lines.append(f"  {label.ljust(_LABEL)}{text}")

    if d.get("description"):
        row("description", str(d["description"]))
    row("handler", str(manifest.get("handler", "")))
    row("inputs", _tensors(manifest.get("inputs") or {}))
    row("outputs", _tensors(manifest.get("outputs") or {}))
    row("traffic", ", ".join(f"{v} {p}%" for v, p in (d.get("traffic") or {}).items()))
    versions = d.get("versions") or []
    row("versions", f"{len(versions)} stored (fnrt versions {d['name']})")
    rollout = d.get("rollout")
    if rollout:
        row("rollout", _rollout(rollout))
    row("requests", _requests(inst))
    if inst.get("compute", {}).get("count"):
        row("latency", _latency(inst))
    if inst.get("batches"):
        row("batches", _batches(inst))
    row("loads", _loads(inst))
    if inst.get("restarts"):
        restarts = ", ".join(f"{k} {n}" for k, n in inst["restarts"].items())
        row("restarts", f"{restarts} (last: {inst.get('last_restart_reason')})")
    breaker = inst.get("breaker") or {}
    if breaker:
        row("breaker", f"{breaker.get('state')}, opened {breaker.get('opened', 0)} times")
    if inst.get("result_cache"):
        cache = inst["result_cache"]
        row("cache", ", ".join(f"{k} {v}" for k, v in cache.items()))
    requirements = (manifest.get("environment") or {}).get("requirements") or []
    if requirements:
        row("environment", ", ".join(requirements))
    row("scaling", _scaling(manifest.get("scaling") or {}, d.get("keep_alive") or {}))
    generation = inst.get("generation")
    if generation is not None:
        row("generation", _generation(generation))
    else:
        row("batching", _batching(manifest.get("batching") or {}))
    lines.append("(fnrt describe NAME --json for everything)")
    return "\n".join(lines)


def _state(inst: Mapping[str, Any]) -> str:
    if not inst:
        return "cold"
    n = inst.get("instances", 0)
    where = inst.get("isolation", "")
    busy = f", {inst.get('queued', 0)} queued, {inst.get('running', 0)} running"
    plural = "" if n == 1 else "s"
    return f"{inst.get('state', '?')} ({n} instance{plural}, {where}{busy})"


def _tensors(specs: Mapping[str, Mapping[str, Any]]) -> str:
    return ", ".join(
        f"{name} {spec.get('dtype')}{list(spec.get('shape', []))}" for name, spec in specs.items()
    )


def _rollout(r: Mapping[str, Any]) -> str:
    text = f"{r.get('policy')} to {r.get('to')}: {r.get('state')}"
    if r.get("state") == "running" and r.get("percent") is not None:
        text += f" at {r['percent']}%"
    if r.get("reason"):
        text += f" ({r['reason']})"
    return text


def _requests(inst: Mapping[str, Any]) -> str:
    parts = [f"{inst.get('requests', 0)} served", f"{inst.get('errors', 0)} errors"]
    for key in ("rejected", "expired", "abandoned"):
        if inst.get(key):
            parts.append(f"{inst[key]} {key}")
    return ", ".join(parts)


def _latency(inst: Mapping[str, Any]) -> str:
    q, c = inst.get("queue_wait") or {}, inst.get("compute") or {}
    return (
        f"queue p50 {_ms(q.get('p50_ms'))} p99 {_ms(q.get('p99_ms'))}; "
        f"compute p50 {_ms(c.get('p50_ms'))} p99 {_ms(c.get('p99_ms'))}"
    )


def _generation(g: Mapping[str, Any]) -> str:
    """A generative function's sequences: active now, ended, and their token times."""
    first = g.get("time_to_first_token") or {}
    per = g.get("time_per_output_token") or {}
    ended = ", ".join(f"{k} {n}" for k, n in (g.get("ended") or {}).items()) or "none ended"
    return (
        f"{g.get('active_sequences', 0)} active of {g.get('max_active')}; {ended}; "
        f"{g.get('tokens', 0)} tokens; first token p50 {_ms(first.get('p50_ms'))} "
        f"p99 {_ms(first.get('p99_ms'))}; per token p50 {_ms(per.get('p50_ms'))}"
    )


def _ms(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f} ms"


def _batches(inst: Mapping[str, Any]) -> str:
    sizes = inst.get("batch_sizes") or {}
    total = sum(int(size) * n for size, n in sizes.items())
    count = int(inst["batches"])
    return f"{count}, mean size {total / count:.1f}" if total else str(count)


def _loads(inst: Mapping[str, Any]) -> str:
    if not inst:
        return "none yet (loads on its first call)"
    text = f"{inst.get('loads', 0)}"
    timings = inst.get("last_load_timings_s") or {}
    if inst.get("last_load_tier"):
        total = timings.get("total_s")
        took = f" in {float(total):.2f} s" if total is not None else ""
        text += f" (last from {inst['last_load_tier']}{took})"
    if inst.get("load_failures"):
        text += f", {inst['load_failures']} failed: {inst.get('last_load_error')}"
    starts = inst.get("starts") or {}
    if any(starts.values()):
        text += "; starts " + ", ".join(f"{k} {n}" for k, n in starts.items() if n)
    return text


def _scaling(s: Mapping[str, Any], keep_alive: Mapping[str, Any]) -> str:
    policy = keep_alive.get("policy", s.get("keep_alive_policy", ""))
    seconds = s.get("keep_alive_s")
    if isinstance(seconds, float):
        seconds = f"{seconds:g}"  # as a manifest writes it: 300, not 300.0
    text = (
        f"instances {s.get('min_instances', 0)}..{s.get('max_instances', 1)}, "
        f"queue {s.get('max_queue')}, keep-alive {policy} (keep_alive_s {seconds})"
    )
    if keep_alive.get("why"):  # the learned plan: why, and when
        text += f"; plan: {keep_alive['why']}, {keep_alive.get('plan', '')}"
        for key, label in (
            ("unload_after_unix_s", "warm until"),
            ("prewarm_at_unix_s", "next pre-warm"),
        ):
            if keep_alive.get(key):
                when = time.strftime("%H:%M:%S", time.gmtime(keep_alive[key]))
                text += f", {label} {when} UTC"
    return text


def _batching(b: Mapping[str, Any]) -> str:
    text = f"{b.get('mode')}, up to {b.get('max_batch_size')}"
    if b.get("mode") == "fixed":
        return text + f", waiting at most {b.get('max_wait_ms')} ms"
    return text + f", p99 target {b.get('target_p99_ms')} ms"
