"""The edge client: run a model's head on this device, its tail on fnrt.

Needs numpy, msgpack and onnxruntime, nothing of the server::

    from fnrt.edge.client import EdgeClient, EdgeConfig

    with EdgeClient("http://fnrt:8000", "cnn-split", EdgeConfig(cache_dir=Path("edge-cache"))) as c:
        result = c.run({"x": image})        # result.outputs["y"], result.split, ...

On first use it fetches the plan data (split points, head digests, the
server's time per segment), downloads the heads it may run (kept in
``cache_dir`` by digest and checked against it, so a corrupted file is never
run), and times each head here once. Each call then runs the head of the
planned split, sends the activation, and returns the outputs; the link's RTT
and bandwidth are estimated from the calls themselves, and the plan is made
again when they move (or the server's load does). When the server cannot be
reached and the whole model fits this device, the call runs here entirely.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fnrt.edge.activation import Encoding, pack, read_outputs
from fnrt.edge.link import LinkConfig, LinkEstimate
from fnrt.edge.planner import Link, Plan, Profile, choose_split
from fnrt.edge.transport import HttpTransport, Response, Transport
from fnrt.functions.errors import (
    FnrtError,
    IntegrityError,
    InvalidInput,
    NoSuchSplit,
    Unavailable,
)
from fnrt.functions.extras import require
from fnrt.functions.headers import DIGEST_HEADER, SERVER_MS_HEADER, VERSION_HEADER

log = logging.getLogger("fnrt.edge")

Array = np.ndarray[Any, Any]

PROBE_PATH = "/v1/probe"
#: How many of a head's latest times (the profile's first) its estimate is the median of.
HEAD_SAMPLES = 9
#: A change (relative) in the server's wait or the planned head's time that makes a plan stale.
REPLAN_CHANGE = 0.25


@dataclass(frozen=True)
class EdgeConfig:
    """How the edge client runs.

    ``split`` fixes the split (None: the planner chooses). Heads larger than
    ``max_model_bytes`` are never downloaded, and the whole model runs here
    (planned, or offline) only when it fits. ``plan_refresh_s`` is how often
    the server's load is asked again; ``threads`` the onnxruntime threads here.
    ``emulate_slowdown`` makes every model run here take that many times as long
    (a slower device, for trying plans; see also :class:`Throttled` for the link).
    """

    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "fnrt-edge")
    encoding: Encoding = Encoding.FLOAT32
    split: int | None = None
    max_model_bytes: int = 256 * 1024 * 1024
    profile_runs: int = 9
    plan_refresh_s: float = 30.0
    threads: int = 1
    timeout_s: float = 30.0
    emulate_slowdown: float = 1.0

    def __post_init__(self) -> None:
        if not self.emulate_slowdown >= 1:
            raise ValueError("emulate_slowdown: must be >= 1 (1: this device as it is)")
        if self.split is not None and self.split < 0:
            raise ValueError("split: must be >= 0 (or None to plan)")
        if self.max_model_bytes < 0:
            raise ValueError("max_model_bytes: must be >= 0")
        if self.profile_runs < 1:
            raise ValueError("profile_runs: must be >= 1")
        if not self.plan_refresh_s > 0 or not self.timeout_s > 0:
            raise ValueError("plan_refresh_s and timeout_s: must be > 0")
        if self.threads < 1:
            raise ValueError("threads: must be >= 1")


@dataclass(frozen=True)
class EdgeResult:
    """One call's outputs, where it was split, and where its time went (ms).

    ``total_ms`` is ``plan_ms + head_ms + encode_ms + request_ms`` and the
    decoding of the answer. ``plan_ms`` is near 0 but on a client's first call
    (and after the version changes), which fetches the plan and the heads and
    times each head here; ``head_ms`` is the model's run here alone."""

    outputs: dict[str, Array]
    split: int
    version: str
    head_ms: float
    request_ms: float  # the upload and answer, network and server together
    server_ms: float  # the server's own part of request_ms
    total_ms: float
    offline: bool = False
    plan_ms: float = 0.0  # choosing the split: fetching plan and heads, timing them
    encode_ms: float = 0.0  # packing the activation for the wire

    @property
    def other_ms(self) -> float:
        """What the parts do not account for (decoding the answer, the client's own work)."""
        parts = self.plan_ms + self.head_ms + self.encode_ms + self.request_ms
        return max(self.total_ms - parts, 0.0)


class EdgeUnavailable(Unavailable):
    """The server cannot be reached and this device cannot run the model alone."""


class EdgeClient:
    """Split inference of one function from this device (see the module docstring)."""

    def __init__(
        self,
        server: str,
        name: str,
        config: EdgeConfig | None = None,
        *,
        transport: Transport | None = None,
        tracer: Any = None,
        link: LinkConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        key: str | None = None,
    ) -> None:
        """``clock`` says when the plan data is due again (seconds); ``timer`` times
        calls, heads and probes (seconds), and ``sleep`` makes an emulated slowdown:
        all three injectable, so a test runs the client on a virtual clock. ``key``: the
        function's invoke key, where it has keys (its plan, heads and tails need one),
        sent by the default transport."""
        self.name = name
        self.config = config or EdgeConfig()
        self.transport = transport or HttpTransport(server, self.config.timeout_s, key)
        self.tracer = tracer  # a fnrt.tracing Tracer (client_tracer), or None
        self.link = LinkEstimate(link)
        self._clock = clock
        self._timer = timer
        self._sleep = sleep
        self._folder = self.config.cache_dir / _slug(server) / name
        self._plan_data: dict[str, Any] | None = None
        self._fetched_at = -float("inf")
        self._sessions: dict[int, Any] = {}  # k -> onnxruntime session of the head
        self._head_ms: list[float] | None = None  # time of each head here (k = 0 .. n + 1)
        self._head_samples: dict[int, deque[float]] = {}
        self._planned_head_ms = 0.0
        self._plan: Plan | None = None
        self._planned_link: Link | None = None
        self._planned_wait_ms = 0.0
        self._sized = False  # a large transfer was timed since the last refresh

    def __enter__(self) -> EdgeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        close = getattr(self.transport, "close", None)
        if close is not None:
            close()

    # --- the plan ------------------------------------------------------------------------

    @property
    def data(self) -> dict[str, Any]:
        """The server's plan data (fetched on first use)."""
        if self._plan_data is None:
            self.refresh()
        assert self._plan_data is not None
        return self._plan_data

    @property
    def splits(self) -> int:
        return int(self.data["splits"])

    def refresh(self) -> None:
        """Ask the server for its plan data again (its load changes); download and time
        the heads of a version not seen before."""
        started = self._timer()
        response = self._call("GET", f"/v1/functions/{self.name}/split", None, {})
        self._observe(len(response.body), started, response)
        if not self._sized:
            self._probe()
        self._sized = False
        data = json.loads(response.body)
        changed = self._plan_data is None or data["version"] != self._plan_data["version"]
        self._plan_data, self._fetched_at = data, self._clock()
        if changed:
            self._sessions, self._head_ms, self._plan = {}, None, None
            self._head_samples = {}
            self._folder.mkdir(parents=True, exist_ok=True)
            _write_atomic(self._folder / "plan.json", response.body)
            self._load_heads(online=True)

    def _probe(self) -> None:
        """Time an upload the server drops: a bandwidth sample, of ``probe_bytes`` or,
        after a sample that large, an eighth of it (two sizes fix the line)."""
        size = self.link.config.probe_bytes
        if (self.link.last_bytes or 0) > size // 2:
            size //= 8
        body = bytes(size)
        started = self._timer()
        response = self._call(
            "POST", PROBE_PATH, body, {"content-type": "application/octet-stream"}
        )
        self._observe(len(body) + len(response.body), started, response)

    def _observe(self, moved_bytes: int, started: float, response: Response) -> None:
        server_ms = float(response.headers.get(SERVER_MS_HEADER, "0") or 0)
        self.link.observe(moved_bytes, self._timer() - started, server_ms / 1000.0)
        if moved_bytes >= self.link.config.probe_bytes // 4:
            self._sized = True

    def profile(self) -> Profile:
        """The planner's input: this device's and the server's time per segment."""
        data = self.data
        heads = self._heads_ms()
        device_ms = [
            max(heads[k + 1] - heads[k], 0.0) if math.isfinite(heads[k + 1]) else math.inf
            for k in range(len(heads) - 1)
        ]
        inputs_bytes = sum(int(p["row_bytes"]) for p in data["inputs"])
        sent = [inputs_bytes, *(int(p["row_bytes"]) for p in data["points"])]
        scale = self.config.encoding.item_bytes / 4  # sizes are float32; the input is packed too
        return Profile(
            device_ms=tuple(device_ms),
            server_ms=tuple(float(t) for t in data["server_ms"]),
            sent_bytes=tuple(int(b * scale) for b in sent),
            result_bytes=int(data["output_row_bytes"]),
            server_wait_ms=float(data["server_wait_ms"]),
        )

    def plan(self) -> Plan:
        """The split to use now, planned again when the link or the server's load moved."""
        if self._clock() - self._fetched_at >= self.config.plan_refresh_s:
            self.refresh()
        if self._plan is not None and self.link.changed_since(self._planned_link):
            # The link changed: start the estimate again from the newest call, and
            # time a probe of another size (calls of one size cannot tell a slower
            # link from a farther one).
            self.link.restart()
            self._probe()
        link = self.link.link
        wait = float(self.data["server_wait_ms"])
        stale = (
            self._plan is None
            or self.link.changed_since(self._planned_link)
            or _moved(wait, self._planned_wait_ms)
            or _moved(self._heads_ms()[self._plan.split], self._planned_head_ms)
        )
        if stale:
            if link is None:  # two samples too close in size to fit a line: one more
                self._probe()
                link = self.link.link
            if link is None:
                raise FnrtError("cannot estimate the link: probes of two sizes did not fit")
            allowed = self._allowed()
            if not allowed:  # several inputs (no split 0), and no head fits this device
                raise NoSuchSplit(
                    self.name,
                    "no split fits this device: the model has several inputs (split 0 sends "
                    "one) and no head within max_model_bytes; raise it or use /invoke",
                )
            self._plan = choose_split(self.profile(), link, allowed)
            self._planned_link, self._planned_wait_ms = link, wait
            self._planned_head_ms = self._heads_ms()[self._plan.split]
            log.info("split plan for %s: %d (%s)", self.name, self._plan.split, _ms(self._plan))
        assert self._plan is not None
        return self._plan

    def _allowed(self) -> set[int]:
        """The splits this device can take: those whose head it holds, and split 0 (the
        input sent as it is) for a model of one input."""
        sends_input = len(self.data["inputs"]) == 1
        return {*({0} if sends_input else ()), *self._sessions}

    # --- one call ------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, Array], split: int | None = None) -> EdgeResult:
        """Answer ``inputs`` with the planned split (or ``split``, or the configured one)."""
        root = self._span("edge.run", None, {"fnrt.function": self.name})
        try:
            result = self._run(inputs, split, root)
        except BaseException as exc:
            if root is not None:
                from fnrt.tracing.spans import fail

                fail(root, exc)
                root.end()
            raise
        if root is not None:
            root.set_attribute("fnrt.split", result.split)
            root.set_attribute("fnrt.edge.offline", result.offline)
            root.end()
        return result

    def _run(
        self, inputs: Mapping[str, Array], split: int | None, root: Any, *, again: bool = False
    ) -> EdgeResult:
        started = self._timer()
        try:
            chosen = split if split is not None else self.config.split
            if chosen is not None and self._clock() - self._fetched_at >= (
                self.config.plan_refresh_s
            ):  # a fixed split follows the server's versions as a planned one does
                self.refresh()
            k = chosen if chosen is not None else self.plan().split
            last = self.splits - 1
        except OSError as exc:
            return self._offline(inputs, started, root, exc)
        if not 0 <= k <= last:
            raise NoSuchSplit(self.name, f"split {k} is not one of 0 to {last}")
        if k == last:
            return self._locally(inputs, started, root, offline=False)
        head_started = self._timer()
        span = self._span("edge.head", root, {"fnrt.split": k})
        activation = self._head(k, inputs)
        head_ended = self._timer()
        head_ms = (head_ended - head_started) * 1000.0
        if span is not None:
            span.end()
        if k > 0:
            self._learn(k, head_ms)
        body = pack(activation, self.config.encoding)
        sent_at = self._timer()
        try:
            response = self._upload(k, body, root)
        except OSError as exc:
            return self._offline(inputs, started, root, exc)
        except NoSuchSplit:  # its version gone (deleted, redeployed): the plan again, once
            if again:
                raise
            self.refresh()
            return self._run(inputs, split, root, again=True)
        request_s = self._timer() - sent_at
        server_ms = float(response.headers.get(SERVER_MS_HEADER, "0") or 0)
        self._observe(len(body) + len(response.body), sent_at, response)
        return EdgeResult(
            read_outputs(response.body),
            k,
            str(self.data["version"]),
            head_ms,
            request_s * 1000.0,
            server_ms,
            (self._timer() - started) * 1000.0,
            plan_ms=(head_started - started) * 1000.0,
            encode_ms=(sent_at - head_ended) * 1000.0,
        )

    def _feed(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """The model's inputs from ``inputs``, in their declared dtypes; FnrtError if any
        is missing, InvalidInput if one is not of its declared shape ``[n, ...]`` or
        cannot be its dtype (said here, as the server says it of an activation, not in
        onnxruntime's words from inside a head)."""
        names = [p["name"] for p in self.data["inputs"]]
        missing = set(names) - set(inputs)
        if missing:
            raise FnrtError(f"inputs {sorted(missing)} are missing (the model takes {names})")
        feed = {}
        for p in self.data["inputs"]:
            name, row_shape = p["name"], tuple(p["row_shape"])
            try:
                array = np.asarray(inputs[name], dtype=p["dtype"])
            except (TypeError, ValueError) as exc:
                raise InvalidInput(f"input {name!r}: not {p['dtype']}: {exc}", input=name) from None
            fits = array.ndim == len(row_shape) + 1 and all(
                want < 0 or got == want
                for got, want in zip(array.shape[1:], row_shape, strict=True)
            )
            if not fits or not len(array):
                rows = ", ".join(map(str, row_shape))
                raise InvalidInput(
                    f"input {name!r} must have shape [n, {rows}] with n >= 1, "
                    f"got {list(array.shape)}",
                    input=name,
                )
            feed[name] = array
        counts = {name: len(array) for name, array in feed.items()}
        if len(set(counts.values())) > 1:
            raise InvalidInput(f"the inputs must have as many rows each, got {counts}")
        return feed

    def _head(self, k: int, inputs: Mapping[str, Array]) -> Array:
        feed = self._feed(inputs)
        if k == 0:
            if len(feed) != 1:
                raise NoSuchSplit(self.name, "split 0 sends one input; this model has several")
            return next(iter(feed.values()))
        session = self._session(k)
        (activation,) = self._timed_run(session, [self.data["points"][k - 1]["name"]], feed)
        return np.asarray(activation)

    def _timed_run(self, session: Any, outputs: list[str] | None, feed: dict[str, Array]) -> Any:
        """``session.run``, made ``emulate_slowdown`` times as long."""
        started = self._timer()
        ran = session.run(outputs, feed)
        if self.config.emulate_slowdown > 1:
            self._sleep((self._timer() - started) * (self.config.emulate_slowdown - 1))
        return ran

    def _upload(self, k: int, body: bytes, root: Any) -> Response:
        headers = {
            "content-type": "application/msgpack",
            "accept": "application/msgpack",
            VERSION_HEADER: str(self.data["version"]),
        }
        attributes = {"fnrt.split": k, "fnrt.split.bytes": len(body)}
        span = self._span("edge.upload", root, attributes, client=True)
        if span is not None:
            from fnrt.tracing.spans import inject

            inject(span, headers)
        try:
            response = self._call("POST", f"/v1/functions/{self.name}/split/{k}", body, headers)
        finally:
            if span is not None:
                span.end()
        return response

    def _offline(
        self, inputs: Mapping[str, Array], started: float, root: Any, error: OSError
    ) -> EdgeResult:
        """The server is unreachable: the whole model here, if this device holds it."""
        if self._plan_data is None:
            cached = self._folder / "plan.json"
            if cached.is_file():
                self._plan_data = json.loads(cached.read_bytes())
                self._load_heads(online=False)
        if self._plan_data is None or self.splits - 1 not in self._sessions:
            raise EdgeUnavailable(
                f"cannot reach the server ({error}) and the whole of '{self.name}' "
                "is not on this device (never fetched, or larger than max_model_bytes)"
            ) from error
        log.warning("server unreachable (%s): running %s on this device", error, self.name)
        return self._locally(inputs, started, root, offline=True)

    def _locally(
        self, inputs: Mapping[str, Array], started: float, root: Any, *, offline: bool
    ) -> EdgeResult:
        last = self.splits - 1
        span = self._span("edge.head", root, {"fnrt.split": last})
        planned = self._timer()
        feed = self._feed(inputs)
        mark = self._timer()
        ran = self._timed_run(self._session(last), list(self.data["outputs"]), feed)
        model_ms = (self._timer() - mark) * 1000.0
        self._learn(last, model_ms)
        if span is not None:
            span.end()
        total = (self._timer() - started) * 1000.0
        outputs = {n: np.asarray(v) for n, v in zip(self.data["outputs"], ran, strict=True)}
        return EdgeResult(
            outputs,
            last,
            str(self.data["version"]),
            model_ms,
            0.0,
            0.0,
            total,
            offline=offline,
            plan_ms=(planned - started) * 1000.0,
        )

    # --- heads ---------------------------------------------------------------------------

    def _session(self, k: int) -> Any:
        if k not in self._sessions:
            raise NoSuchSplit(
                self.name, f"the head of split {k} is not on this device (max_model_bytes)"
            )
        return self._sessions[k]

    def _load_heads(self, *, online: bool) -> None:
        """Open every head that fits, from the cache or (online) downloaded and verified."""
        ort = require("onnxruntime", "running a model's head on this device", extra="edge")
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.config.threads
        options.inter_op_num_threads = 1
        for head in self.data["heads"]:
            k, digest, size = int(head["k"]), str(head["digest"]), int(head["size_bytes"])
            if size > self.config.max_model_bytes:
                continue
            path = self.config.cache_dir / "heads" / f"{digest}.onnx"
            if not (path.is_file() and _sha256(path.read_bytes()) == digest):
                if not online:
                    continue
                path.unlink(missing_ok=True)  # corrupted in the cache: fetch it again
                self._download(k, digest, path)
            self._sessions[k] = ort.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )

    def _download(self, k: int, digest: str, path: Path) -> None:
        started = self._timer()
        version = self.data["version"]  # the plan's: during a canary, routing may pick another
        url = f"/v1/functions/{self.name}/split/{k}/head?version={version}"
        response = self._call("GET", url, None, {})
        self._observe(len(response.body), started, response)
        announced = response.headers.get(DIGEST_HEADER, "").removeprefix("sha256:")
        actual = _sha256(response.body)
        if actual != digest or announced != digest:
            raise IntegrityError(digest, actual)  # never run a head that is not the planned one
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(path, response.body)

    def _heads_ms(self) -> list[float]:
        if self._head_ms is None:
            self._head_ms = self._time_heads()
        return self._head_ms

    def _learn(self, k: int, head_ms: float) -> None:
        """Add a time head ``k`` just took: its estimate is the median of the latest
        (one stall does not move it; a device that got slower does, in a few
        calls), and a plan it makes stale is made again."""
        heads = self._heads_ms()
        recent = self._head_samples.setdefault(k, deque([heads[k]], maxlen=HEAD_SAMPLES))
        recent.append(head_ms)
        heads[k] = statistics.median(recent)

    def _time_heads(self) -> list[float]:
        """The median time of each head this device holds, one row of zeros (head 0
        takes no time; heads it does not hold: unknown, so infinite)."""
        data = self.data
        head_ms = [0.0]
        names = [p["name"] for p in data["inputs"]]
        feed = {
            n: np.zeros((1, *p["row_shape"]), dtype=p["dtype"])
            for n, p in zip(names, data["inputs"], strict=True)
        }
        for k in range(1, self.splits):
            if k not in self._sessions:
                break
            session = self._sessions[k]
            session.run(None, feed)  # warm-up: first runs allocate
            session.run(None, feed)
            times = []
            for _ in range(self.config.profile_runs):
                mark = self._timer()
                self._timed_run(session, None, feed)
                times.append((self._timer() - mark) * 1000.0)
            head_ms.append(statistics.median(times))
        return head_ms + [float("inf")] * (self.splits - len(head_ms))

    # --- plumbing ------------------------------------------------------------------------

    def _call(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> Response:
        response = self.transport.request(method, path, body, headers)
        if response.status in (200, 204):
            return response
        message = _error_message(response)
        if response.status == 404:  # the server's message already names the function
            raise NoSuchSplit(self.name, message.removeprefix(f"function '{self.name}': "))
        if response.status in (429, 503):
            raise Unavailable(message)
        raise FnrtError(f"the server answered {response.status}: {message}")

    def _span(
        self, name: str, parent: Any, attributes: dict[str, Any], *, client: bool = False
    ) -> Any:
        """A span of this call (None without a tracer); ``client``: it makes a request."""
        if self.tracer is None:
            return None
        from fnrt.tracing.recorder import SpanKind

        return self.tracer.start(
            name,
            parent.context if parent is not None else None,
            kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
            attributes=attributes,
        )


def _error_message(response: Response) -> str:
    import msgpack

    try:
        if "json" in response.headers.get("content-type", ""):
            payload = json.loads(response.body)
        else:
            payload = msgpack.unpackb(response.body, raw=False)
        return str(payload.get("error", payload))
    except Exception:
        return response.body[:200].decode("utf-8", "replace")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _slug(server: str) -> str:
    return hashlib.sha256(server.rstrip("/").encode()).hexdigest()[:16]


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _moved(now: float, planned: float) -> bool:
    return abs(now - planned) > REPLAN_CHANGE * max(planned, 1.0)


def _ms(plan: Plan) -> str:
    return ", ".join(f"{k}: {t:.1f} ms" for k, t in enumerate(plan.predicted_ms))
