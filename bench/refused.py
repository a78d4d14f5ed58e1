"""What a request that is refused costs the server, against an invoke it serves.

    python bench/refused.py [--seconds 3] [--rounds 3] [--baseline REV]   (needs wrk)

"Break it before a user does": for each input path, the smallest request that
costs the most. Each kind below is sent by ``wrk -c32`` to ``fnrt serve`` (default
settings: worker processes, the request log on) with ``examples/mlp`` deployed,
and its requests/s, p99 and the server's CPU a request (all of its processes) are
printed beside an invoke that the model answers, measured in the same round:
a refusal should cost no more than a served request. With ``--baseline REV``
a second server runs ``REV``'s packages (``git archive``, as ``invoke.py``
does), one after the other in each round, each alone on the machine while it
is measured. Kinds:

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
from pathlib import Path

from invoke import FORMATS, bodies, checkout, deploy
from loadgen import Result, copy_mlp, require_wrk, start_fnrt, write_script, wrk

X = [[0.1] * 64]


def kinds(url: str, work: Path) -> dict[str, tuple[str, Path]]:
    """Each kind's URL and wrk script."""
    invoke = f"{url}/v1/functions/mlp/invoke"
    oip = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": X[0]}]}

    def script(name: str, body: bytes, headers: dict[str, str] | None = None) -> Path:
        return write_script(work, name, "application/json", body, headers)

    body = json.dumps({"x": X}).encode()
    return {
        "invoke": (invoke, bodies(work)[FORMATS[0]]),
        "unknown function": (f"{url}/v1/functions/nobody/invoke", script("nobody", body)),
        "unknown version": (invoke, script("pinned", body, {"x-fnrt-version": "v-000000000000"})),
        "OIP unknown version": (
            f"{url}/v2/models/mlp/versions/v-000000000000/infer",
            script("oip", json.dumps(oip).encode()),
        ),
        "bad name": (f"{url}/v1/functions/No!/invoke", script("badname", body)),
        "wrong input": (invoke, script("wrong", json.dumps({"y": X}).encode())),
        "malformed JSON": (invoke, script("malformed", b"{nope")),
    }


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
            for tree, environ in trees.items():
                folder = work / f"{tree}-{round_}"
                folder.mkdir()
                url, proc = start_fnrt(str(folder / "store"), folder / "cache", environ)
                try:
                    deploy(url, example, environ)
                    for name, (target, script) in kinds(url, folder).items():
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
            for name in kinds("", work):
                rounds = results[(tree, name)]
                rps = statistics.median(r.rps for r in rounds)
                p99 = statistics.median(r.p99_ms for r in rounds)
                cpu = statistics.median(r.cpu_us or 0.0 for r in rounds)
                status = "200" if name == "invoke" else "4xx" if rounds[0].errors else "?"
                print(
                    f"{tree:<10} {name:<22} {status:>6} {rps:>8.0f} {p99:>7.2f} {cpu:>11.1f} "
                    f"{cpu / served:>12.2f}x"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
