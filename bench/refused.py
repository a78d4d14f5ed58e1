"""What a request that is refused costs the server, against an invoke it serves.

    python bench/refused.py [--seconds 3] [--rounds 3] [--baseline REV]   (needs wrk)

"Break it before a user does": for each input path, the smallest request that
costs the most. Each kind below is sent by ``wrk -c32`` to ``fnrt serve`` (default
settings: worker processes, the request log on) with ``examples/mlp`` deployed,
and its requests/s, p99 and the server's CPU a request (all of its processes) are
printed beside an invoke that the model answers, measured in the same round:
a refusal should cost no more than a served request. With ``--baseline REV``
a second server runs ``REV``'s packages (``git archive``, as ``invoke.py``
does), one after the other in each round (each first in turn), each alone on
the machine while it is measured; each kind's status is checked with one
request before it is timed. Kinds:

- ``invoke``: a (1, 64) float32 JSON invoke, answered 200 (the baseline);
- ``unknown function``: an invoke of a name nobody deployed (404);
- ``unknown version``: an invoke pinned (``x-fnrt-version``) to a version id the
  store does not hold (404);
- ``OIP unknown version``: the same through ``/v2/models/{m}/versions/{v}/infer``;
- ``bad name``: a name no function can have (404);
- ``wrong input``: a body naming an input the function does not have (422);
- ``malformed JSON`` (400).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from invoke import checkout, deploy
from loadgen import Result, copy_mlp, require_wrk, start_fnrt, write_script, wrk

X = [[0.1] * 64]
#: Each kind, and the status it must answer (checked once a server, before it is timed).
KINDS = {
    "invoke": 200,
    "unknown function": 404,
    "unknown version": 404,
    "OIP unknown version": 404,
    "bad name": 404,
    "wrong input": 422,
    "malformed JSON": 400,
}


def kinds(url: str) -> dict[str, tuple[str, bytes, dict[str, str]]]:
    """Each kind's URL, body and headers (a JSON content type on each)."""
    invoke = f"{url}/v1/functions/mlp/invoke"
    oip = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": X[0]}]}
    body = json.dumps({"x": X}).encode()
    pinned = {"x-fnrt-version": "v-000000000000"}
    return {
        "invoke": (invoke, body, {}),
        "unknown function": (f"{url}/v1/functions/nobody/invoke", body, {}),
        "unknown version": (invoke, body, pinned),
        "OIP unknown version": (
            f"{url}/v2/models/mlp/versions/v-000000000000/infer",
            json.dumps(oip).encode(),
            {},
        ),
        "bad name": (f"{url}/v1/functions/No!/invoke", body, {}),
        "wrong input": (invoke, json.dumps({"y": X}).encode(), {}),
        "malformed JSON": (invoke, b"{nope", {}),
    }


def status_of(url: str, body: bytes, headers: dict[str, str]) -> int:
    """The status one such request gets."""
    sent = {"content-type": "application/json", **headers}
    request = urllib.request.Request(url, data=body, headers=sent, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--baseline", help="a commit to measure beside this tree")
    args = parser.parse_args()
    require_wrk()
    work = Path(tempfile.mkdtemp(prefix="fnrt-refused-"))
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    trees = {"now": env}
    if args.baseline:
        trees[args.baseline] = env | {"PYTHONPATH": str(checkout(args.baseline, work))}
    example, _ = copy_mlp(work)
    results: dict[tuple[str, str], list[Result]] = {}
    try:
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}/{args.rounds}", flush=True)
            order = list(trees) if round_ % 2 == 0 else list(trees)[::-1]  # each first in turn
            for tree in order:
                environ = trees[tree]
                folder = work / f"{tree}-{round_}"
                folder.mkdir()
                url, proc = start_fnrt(str(folder / "store"), folder / "cache", environ)
                try:
                    deploy(url, example, environ)
                    for i, (name, (target, body, headers)) in enumerate(kinds(url).items()):
                        script = write_script(folder, f"kind{i}", "application/json", body, headers)
                        status = status_of(target, body, headers)
                        if status != KINDS[name]:
                            raise SystemExit(f"{tree}: {name} answered {status}, not {KINDS[name]}")
                        wrk(target, script, args.connections, 1)  # warm: the first load
                        result = wrk(target, script, args.connections, args.seconds, proc.pid)
                        results.setdefault((tree, name), []).append(result)
                finally:
                    proc.terminate()
                    proc.wait(30)
        print(
            f"\nexamples/mlp, {args.connections} connections, {args.seconds} s x "
            f"{args.rounds} rounds (median round); CPU: the server's, its workers included\n"
        )
        head = f"{'tree':<10} {'request':<22} {'status':>6} {'req/s':>8} {'p99 ms':>7}"
        print(f"{head} {'CPU us/req':>11} {'CPU / invoke':>13}")
        for tree in trees:
            served = statistics.median(r.cpu_us or 0.0 for r in results[(tree, "invoke")])
            for name, status in KINDS.items():
                rounds = results[(tree, name)]
                rps = statistics.median(r.rps for r in rounds)
                p99 = statistics.median(r.p99_ms for r in rounds)
                cpu = statistics.median(r.cpu_us or 0.0 for r in rounds)
                print(
                    f"{tree:<10} {name:<22} {status:>6} {rps:>8.0f} {p99:>7.2f} {cpu:>11.1f} "
                    f"{cpu / served:>12.2f}x"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
