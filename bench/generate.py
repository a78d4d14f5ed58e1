"""Generative serving: one sequence at a time, static batching, continuous batching.

    python bench/generate.py [--duration-s 15] [--rates 0.5,1.5,4] [--plot PNG]

``examples/tiny-lm`` is trained by its own script, then one ``fnrt serve``
serves it three ways, each deployed as its own function, at the product's
defaults otherwise (worker processes):

- ``one at a time``: the generative function with ``max_active = 1``;
- ``static``: fnrt's request batcher (``max_batch_size = 16``) over a handler
  that generates a whole batch at once: the batch runs until its longest
  sequence ends, and requests that arrive meanwhile wait for the whole batch
  (what a request/response server does with a language model);
- ``continuous``: the generative function with ``max_active = 16``: sequences
  join and leave between steps.

Requests arrive as a Poisson process at each rate (as multiples of what one
sequence at a time can serve, measured first), the same schedule for every
mode: a prompt from the corpus and ``max_new_tokens`` drawn from 8 to 96, so
lengths differ as real answers do. The generative modes are asked for whole
answers, whose usage says when the server made the first token (so the
client's parsing, on the same cores, does not weigh on one mode more than
another); ``continuous SSE`` streams the same requests, timing the first
chunk's arrival at the client. A static batch answers whole: its first token
is its last. Per mode and rate it prints tokens/s, time to first token and
latency (p50, p99), and their ratios against one sequence at a time in the
same run. ``--isolation thread`` serves the handlers in the server's process
(the default is worker processes: one round trip per step).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from loadgen import ROOT, deploy, start_fnrt

MAX_ACTIVE = 16

STATIC_HANDLER = '''
"""tiny-lm behind the request batcher: a batch generates until its longest sequence ends."""

from fnrt.functions import Sequence

from .handler import TinyLMHandler


class Static(TinyLMHandler):
    def __call__(self, batch):
        seqs = [
            Sequence(i, r, {}, int(r["max_new_tokens"][0])) for i, r in enumerate(batch)
        ]
        texts = [[] for _ in seqs]
        active = list(seqs)
        chunks = self.start(active)
        while True:
            going = []
            for seq, chunk in zip(active, chunks):
                texts[seq.id].append(chunk.outputs["text"][0])
                seq.generated += 1
                if not chunk.done and seq.generated < seq.max_new_tokens:
                    going.append(seq)
            if not going:
                break
            active = going
            chunks = self.step(active)
        return [{"text": [b"".join(t)]} for t in texts]
'''

STATIC_MANIFEST = f"""
name = "lm-static"
handler = "static:Static"
exclude = ["train.py", "corpus.txt"]

[artifacts]
weights = "weights.safetensors"

[inputs]
prompt = {{ dtype = "bytes", shape = [1] }}
max_new_tokens = {{ dtype = "int64", shape = [1] }}

[outputs]
text = {{ dtype = "bytes", shape = [1] }}

[batching]
max_batch_size = {MAX_ACTIVE}

[scaling]
max_queue = 100000
"""


@dataclass(frozen=True)
class Ask:
    at_s: float  # when it is sent, from the start of the run
    prompt: str
    tokens: int


@dataclass(frozen=True)
class Done:
    ask: Ask
    first_s: float  # from its sending to its first token
    total_s: float  # from its sending to its end
    tokens: int
    ended_at_s: float


def schedule(rate: float, duration_s: float, prompts: list[str], seed: int) -> list[Ask]:
    rng = random.Random(seed)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t > duration_s:
            return out
        out.append(Ask(t, rng.choice(prompts), rng.randint(8, 96)))


def build(work: Path) -> dict[str, Path]:
    """The three functions' folders, with weights trained once."""
    base = work / "tiny-lm"
    shutil.copytree(
        ROOT / "examples" / "tiny-lm", base, ignore=shutil.ignore_patterns("*.safetensors")
    )
    subprocess.run([sys.executable, str(base / "train.py")], check=True, capture_output=True)
    folders = {}
    for name, active in (("lm-one", 1), ("lm-continuous", MAX_ACTIVE)):
        folder = work / name
        shutil.copytree(base, folder)
        text = (folder / "fnrt.toml").read_text()
        text = text.replace('name = "tiny-lm"', f'name = "{name}"')
        text = text.replace("max_active = 16", f"max_active = {active}")
        text = text.replace("token_budget = 2048", "token_budget = 0")
        text += "max_queue = 100000\n"  # under [scaling]: nothing refused, all measured
        (folder / "fnrt.toml").write_text(text)
        folders[name] = folder
    static = work / "lm-static"
    shutil.copytree(base, static)
    (static / "static.py").write_text(STATIC_HANDLER)
    (static / "fnrt.toml").write_text(STATIC_MANIFEST)
    folders["lm-static"] = static
    return folders


async def one(client: httpx.AsyncClient, url: str, ask: Ask, start: float, how: str) -> Done:
    """One request, sent at its time: ``stream`` (SSE: the first chunk's arrival is its
    first token), ``whole`` (a generate answered whole: the server's usage says when its
    first token was made) or ``batch`` (an invoke of the static function: its first
    token is its last)."""
    await asyncio.sleep(max(start + ask.at_s - time.perf_counter(), 0))
    sent = time.perf_counter()
    first_s = None
    if how == "stream":
        body = {
            "prompt": [ask.prompt],
            "parameters": {"max_new_tokens": ask.tokens, "stream": True},
        }
        chunks = 0
        async with client.stream("POST", url, json=body) as r:
            r.raise_for_status()
            async for piece in r.aiter_raw():
                seen = piece.count(b"event: chunk")
                if seen and first_s is None:
                    first_s = time.perf_counter() - sent
                chunks += seen
    elif how == "whole":
        body = {"prompt": [ask.prompt], "parameters": {"max_new_tokens": ask.tokens}}
        r = await client.post(url, json=body)
        r.raise_for_status()
        answer = r.json()
        chunks = answer["usage"]["completion_tokens"]
        first_s = answer["usage"]["time_to_first_token_ms"] / 1000
    else:
        r = await client.post(url, json={"prompt": [ask.prompt], "max_new_tokens": [ask.tokens]})
        r.raise_for_status()
        chunks = len(r.json()["text"][0])
    end = time.perf_counter()
    first_s = first_s if first_s is not None else end - sent
    return Done(ask, first_s, end - sent, chunks, end - start)


async def run(url: str, asks: list[Ask], how: str) -> list[Done]:
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=2000)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        start = time.perf_counter()
        return list(await asyncio.gather(*(one(client, url, a, start, how) for a in asks)))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


@dataclass(frozen=True)
class Figures:
    tokens_per_s: float
    first_p50_ms: float
    first_p99_ms: float
    total_p50_ms: float
    total_p99_ms: float


def figures(done: list[Done]) -> Figures:
    span = max(d.ended_at_s for d in done) - min(d.ask.at_s for d in done)
    firsts = [d.first_s * 1000 for d in done]
    totals = [d.total_s * 1000 for d in done]
    return Figures(
        sum(d.tokens for d in done) / span,
        pct(firsts, 0.5),
        pct(firsts, 0.99),
        pct(totals, 0.5),
        pct(totals, 0.99),
    )


def capacity(url: str) -> float:
    """Requests/s one sequence at a time serves at the mean length (closed loop)."""
    asks = [Ask(0, "The keeper", 52) for _ in range(10)]

    async def closed() -> float:
        async with httpx.AsyncClient(timeout=600) as client:
            started = time.perf_counter()
            for a in asks:
                await one(client, url, a, time.perf_counter(), "whole")
            return (time.perf_counter() - started) / len(asks)

    return 1.0 / asyncio.run(closed())


#: mode -> (function, how it is asked: see ``one``)
MODES = {
    "one at a time": ("lm-one", "whole"),
    "static": ("lm-static", "batch"),
    "continuous": ("lm-continuous", "whole"),
    "continuous SSE": ("lm-continuous", "stream"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=15.0)
    parser.add_argument("--rates", default="0.5,1.5,4", help="multiples of one-at-a-time capacity")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, help="draw tokens/s and p99 latency to this PNG")
    parser.add_argument(
        "--isolation", choices=["process", "thread"], default="process", help="fnrt serve's"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fnrt-bench-generate-"))
    prompts = [
        line[:40] for line in (ROOT / "examples/tiny-lm/corpus.txt").read_text().splitlines()
    ]
    try:
        print("== training tiny-lm and building the three functions")
        folders = build(work)
        server, proc = start_fnrt(
            str(work / "store"), work / "cache", dict(os.environ), "--isolation", args.isolation
        )
        try:
            for folder in folders.values():
                deploy(server, folder)
            for name in folders:  # loaded before any measurement
                httpx.post(f"{server}/v1/functions/{name}/warm", timeout=120).raise_for_status()
            warm = Ask(0, "The boy", 8)
            asyncio.run(run(f"{server}/v1/functions/lm-static/invoke", [warm], "batch"))
            one_rate = capacity(f"{server}/v1/functions/lm-one/generate")
            print(f"one sequence at a time serves {one_rate:.1f} requests/s at 52 tokens each")
            results: dict[tuple[str, float], Figures] = {}
            for multiple in [float(r) for r in args.rates.split(",")]:
                rate = multiple * one_rate
                asks = schedule(rate, args.duration_s, prompts, args.seed)
                for mode, (name, how) in MODES.items():
                    route = "invoke" if how == "batch" else "generate"
                    done = asyncio.run(run(f"{server}/v1/functions/{name}/{route}", asks, how))
                    results[(mode, multiple)] = figures(done)
                    time.sleep(1)
            report(results, one_rate)
            if args.plot:
                plot(results, args.plot)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(results: dict[tuple[str, float], Figures], one_rate: float) -> None:
    multiples = sorted({m for _, m in results})
    print()
    print(f"{'rate':>16} {'mode':>15} {'tokens/s':>9} {'first p50':>10} {'first p99':>10} "
          f"{'total p50':>10} {'total p99':>10}   ratios to one at a time: tokens/s, "
          "first p99, total p99")  # fmt: skip
    for m in multiples:
        base = results[("one at a time", m)]
        for mode in MODES:
            f = results[(mode, m)]
            label = f"{m:g}x ({m * one_rate:.1f}/s)"
            print(
                f"{label:>16} {mode:>15} {f.tokens_per_s:9.0f} {f.first_p50_ms:8.0f}ms "
                f"{f.first_p99_ms:8.0f}ms {f.total_p50_ms:8.0f}ms {f.total_p99_ms:8.0f}ms   "
                f"{f.tokens_per_s / base.tokens_per_s:5.2f}x "
                f"{f.first_p99_ms / base.first_p99_ms:6.2f}x "
                f"{f.total_p99_ms / base.total_p99_ms:6.2f}x"
            )


def plot(results: dict[tuple[str, float], Figures], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    multiples = sorted({m for _, m in results})
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in MODES:
        left.plot(multiples, [results[(mode, m)].tokens_per_s for m in multiples], "o-", label=mode)
        right.plot(
            multiples, [results[(mode, m)].first_p99_ms for m in multiples], "o-", label=mode
        )
    left.set(xlabel="arrival rate (x one-at-a-time capacity)", ylabel="tokens/s")
    right.set(
        xlabel="arrival rate (x one-at-a-time capacity)",
        ylabel="time to first token p99 (ms)",
        yscale="log",
    )
    left.legend()
    fig.suptitle("tiny-lm: continuous batching against static and one at a time")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
