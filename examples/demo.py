"""``make demo``: build the examples, serve them, deploy and invoke each, keep serving.

Starts ``fnrt serve`` on 127.0.0.1 (port ``FNRT_PORT``, default 8000) over the
embedded store in ``./.fnrt/store``, deploys ``examples/mlp``,
``examples/mlp-onnx``, ``examples/cnn-split`` and ``examples/tiny-lm`` (trained
here first), invokes each once and prints the result, streams one answer of
``tiny-lm`` token by token, runs a job of 2,000 ``mlp`` records (``fnrt job``)
and one edge split call of ``cnn-split`` (``fnrt edge run``), then keeps
serving until Ctrl-C. The request log (a JSON
line per request) goes to ``.fnrt/requests.log``, so that load on the demo
leaves this terminal readable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PORT = int(os.environ.get("FNRT_PORT", "8000"))
SERVER = f"http://127.0.0.1:{PORT}"
REQUEST_LOG = ROOT / ".fnrt" / "requests.log"


def run(*args: str, stderr: bool = False) -> str:
    out = subprocess.run(
        args, check=True, capture_output=True, text=True, env=os.environ | {"FNRT_SERVER": SERVER}
    )
    return (out.stdout + (out.stderr if stderr else "")).strip()


def wait_ready(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(
                f"fnrt serve exited with {proc.returncode} (is port {PORT} free? set FNRT_PORT)"
            )
        try:
            with urllib.request.urlopen(f"{SERVER}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"fnrt serve did not get ready within {timeout_s:.0f}s")


def main() -> None:
    print("== making example weights")
    run(str(BIN / "python"), str(ROOT / "examples/mlp/make_weights.py"))
    run(str(BIN / "python"), str(ROOT / "examples/mlp-onnx/export.py"))
    run(str(BIN / "python"), str(ROOT / "examples/cnn-split/export.py"))
    print("== training examples/tiny-lm on its corpus (about 30 s)")
    run(str(BIN / "python"), str(ROOT / "examples/tiny-lm/train.py"))

    print(f"== starting fnrt serve on {SERVER}")
    serve = [str(BIN / "fnrt"), "serve", "--port", str(PORT)]
    serve += ["--request-log-file", str(REQUEST_LOG)]
    server = subprocess.Popen(serve)
    try:
        wait_ready(server)
        x = [[round((i % 7) / 7, 3) for i in range(64)]]
        for example in ("mlp", "mlp-onnx"):
            print(f"== fnrt deploy examples/{example}")
            print(run(str(BIN / "fnrt"), "deploy", str(ROOT / "examples" / example), "--quiet"))
            print(f"== fnrt invoke {example}")
            print(run(str(BIN / "fnrt"), "invoke", example, "--json", json.dumps({"x": x})))
        sample = str(ROOT / "examples/cnn-split/sample.json")
        print("== fnrt deploy examples/cnn-split")
        print(run(str(BIN / "fnrt"), "deploy", str(ROOT / "examples/cnn-split"), "--quiet"))
        print("== fnrt invoke cnn-split")
        print(run(str(BIN / "fnrt"), "invoke", "cnn-split", "-i", sample))
        print("== fnrt deploy examples/tiny-lm")
        print(run(str(BIN / "fnrt"), "deploy", str(ROOT / "examples/tiny-lm"), "--quiet"))
        print("== fnrt invoke tiny-lm --stream (continuous batching, token by token)")
        prompt = json.dumps({"prompt": ["The keeper"]})
        stream = [str(BIN / "fnrt"), "invoke", "tiny-lm", "--json", prompt, "--stream"]
        stream += ["--param", "max_new_tokens=80", "--param", "temperature=0.6"]
        subprocess.run(stream, check=True, env=os.environ | {"FNRT_SERVER": SERVER})
        print("== fnrt job submit mlp (2,000 records at the lowest priority, in chunks)")
        records = ROOT / ".fnrt" / "demo-records.jsonl"
        records.write_text(
            "".join(
                json.dumps({"x": [[round(((i + j) % 13) / 13, 3) for j in range(64)]]}) + "\n"
                for i in range(2000)
            )
        )
        submitted = run(str(BIN / "fnrt"), "job", "submit", "mlp", "-i", str(records), "--wait")
        print(submitted)
        job_id = submitted.split()[1].rstrip(":")
        results = ROOT / ".fnrt" / "demo-results.jsonl"
        print(run(str(BIN / "fnrt"), "job", "get", job_id, "-o", str(results)))
        print("== fnrt edge run cnn-split (the head here, the tail on the server)")
        edge = ("--cache-dir", str(ROOT / ".fnrt/edge"), "-v")
        print(run(str(BIN / "fnrt"), "edge", "run", "cnn-split", "-i", sample, *edge, stderr=True))
        print(f"\nServing on {SERVER}. Try:\n")
        print(
            f"  curl -s -X POST {SERVER}/v1/functions/mlp/invoke \\\n"
            "       -H 'content-type: application/json' -d @examples/mlp/sample.json\n"
        )
        print(
            f"  curl -sN -X POST {SERVER}/v1/functions/tiny-lm/generate \\\n"
            "       -H 'content-type: application/json' -H 'accept: text/event-stream' \\\n"
            """       -d '{"prompt": ["The boy"], "parameters": {"max_new_tokens": 60}}'\n"""
        )
        print(f"  {BIN / 'fnrt'} ls --server {SERVER}")
        print(f"  {BIN / 'fnrt'} job ls --server {SERVER}   # the demo's job, and yours")
        print(f"  tail -f {REQUEST_LOG.relative_to(ROOT)}   # a JSON line per request")
        print("\nCtrl-C stops the server.")
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
