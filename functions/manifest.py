"""The function manifest: what a function is called, what it loads, what it takes.

A manifest is written by the user as ``fnrt.toml`` beside the handler::

    name = "mlp"
    handler = "handler:MLP"

    [artifacts]
    weights = "weights.safetensors"

    [inputs]
    x = { dtype = "float32", shape = [-1, 64] }

    [outputs]
    y = { dtype = "float32", shape = [-1, 10] }

    [batching]
    max_batch_size = 16
    max_wait_ms = 1.0

    [scaling]
    keep_alive_s = 300

Every field is validated when the manifest is parsed (at deploy time), and an
error names the field at fault. Unknown keys are errors too, so a typo does not
silently fall back to a default.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import Any

from fnrt.functions.dtypes import DTYPES
from fnrt.functions.errors import ManifestError

MANIFEST_FILE = "fnrt.toml"

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_TENSOR_NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}$")


def check_name(name: str, field_name: str = "name") -> str:
    """Return ``name`` if it is a valid function name, else raise ManifestError."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ManifestError(
            field_name,
            f"{name!r} is not a valid function name "
            "(lowercase letters, digits, '-' and '_', at most 63, starting with a letter or digit)",
        )
    return name


@dataclass(frozen=True)
class TensorSpec:
    """One declared input or output: element type and per-request shape.

    ``shape`` includes the leading batch-of-rows dimension a request carries;
    ``-1`` matches any size in that position.
    """

    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ManifestError("dtype", f"{self.dtype!r} is not one of {sorted(DTYPES)}")
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in self.shape):
            raise ManifestError("shape", f"{list(self.shape)!r} must be a list of integers")
        if any(d < -1 for d in self.shape):
            raise ManifestError("shape", f"{list(self.shape)!r}: sizes are >= 0, or -1 for any")

    def matches_shape(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == len(self.shape) and all(
            want in (-1, got) for want, got in zip(self.shape, shape, strict=True)
        )

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class BatchingConfig:
    """How requests are grouped into one handler call.

    ``mode = "fixed"``: a batch leaves when it holds ``max_batch_size``
    requests or its oldest request has waited ``max_wait_ms``. With the default
    wait of 0 a batch is whatever queued while the previous one ran (Triton's
    default behaviour).

    ``mode = "adaptive"``: the batch size and wait are chosen from the
    handler's measured cost (per item and fixed) so that queue wait + compute
    stays under ``target_p99_ms``; requests that can no longer make it are
    refused early (503). ``max_batch_size`` stays the upper bound, and
    ``max_wait_ms`` (when > 0) caps the wait.
    """

    max_batch_size: int = 8
    max_wait_ms: float = 0.0
    mode: str = "fixed"
    target_p99_ms: float = 100.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_batch_size, int) or not 1 <= self.max_batch_size <= 4096:
            raise ManifestError("max_batch_size", "must be an integer from 1 to 4096")
        if not isinstance(self.max_wait_ms, int | float) or not 0 <= self.max_wait_ms <= 60_000:
            raise ManifestError("max_wait_ms", "must be a number from 0 to 60000")
        if self.mode not in ("fixed", "adaptive"):
            raise ManifestError("mode", f"{self.mode!r} is not 'fixed' or 'adaptive'")
        if not isinstance(self.target_p99_ms, int | float) or not 0 < self.target_p99_ms <= 600_000:
            raise ManifestError("target_p99_ms", "must be a number of milliseconds > 0")

    @property
    def adaptive(self) -> bool:
        return self.mode == "adaptive"


#: How long an idle instance stays loaded (see docs/prewarm.md): ``fixed`` is
#: ``keep_alive_s``; the others learn from the function's idle times.
KEEP_ALIVE_POLICIES = ("auto", "fixed", "histogram", "time_of_day", "trend")


@dataclass(frozen=True)
class ScalingConfig:
    """Instance lifecycle: how many, when to add and drop them, how much to queue.

    The first instance is dropped after ``keep_alive_s`` idle with
    ``keep_alive_policy = "fixed"``; the default ``auto`` learns from the
    function's idle times when to drop it and when to load it again ahead of
    the next call, using ``keep_alive_s`` until it knows enough (scale to zero,
    unless ``min_instances`` keeps it); more start, up to ``max_instances``,
    when the queue holds a full batch for ``scale_up_after_ms``, and each extra
    one stops after ``scale_down_after_s`` idle.
    """

    keep_alive_s: float = 300.0
    max_queue: int = 256
    load_at_start: bool = False
    min_instances: int = 0
    max_instances: int = 1
    scale_up_after_ms: float = 200.0
    scale_down_after_s: float = 30.0
    keep_alive_policy: str = "auto"

    def __post_init__(self) -> None:
        if self.keep_alive_policy not in KEEP_ALIVE_POLICIES:
            raise ManifestError("keep_alive_policy", f"must be one of {list(KEEP_ALIVE_POLICIES)}")
        if not isinstance(self.keep_alive_s, int | float) or self.keep_alive_s < 0:
            raise ManifestError("keep_alive_s", "must be a number of seconds >= 0")
        if not isinstance(self.max_queue, int) or not 1 <= self.max_queue <= 1_000_000:
            raise ManifestError("max_queue", "must be an integer from 1 to 1000000")
        if not isinstance(self.load_at_start, bool):
            raise ManifestError("load_at_start", "must be true or false")
        if not isinstance(self.max_instances, int) or not 1 <= self.max_instances <= 256:
            raise ManifestError("max_instances", "must be an integer from 1 to 256")
        if (
            not isinstance(self.min_instances, int)
            or not 0 <= self.min_instances <= self.max_instances
        ):
            raise ManifestError("min_instances", "must be an integer from 0 to max_instances")
        for name in ("scale_up_after_ms", "scale_down_after_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise ManifestError(name, "must be a number >= 0")


PRIORITIES = ("high", "normal", "low")


@dataclass(frozen=True)
class RequestsConfig:
    """Per-request defaults: priority (``X-Fnrt-Priority`` overrides), timeout
    (``X-Fnrt-Timeout-Ms`` overrides; 0 for none) and how fast waiting requests
    climb a priority class so none starves."""

    default_priority: str = "normal"
    timeout_ms: float = 0.0
    aging_ms: float = 1000.0

    def __post_init__(self) -> None:
        if self.default_priority not in PRIORITIES:
            raise ManifestError("default_priority", f"must be one of {list(PRIORITIES)}")
        if not isinstance(self.timeout_ms, int | float) or self.timeout_ms < 0:
            raise ManifestError("timeout_ms", "must be a number of milliseconds >= 0")
        if not isinstance(self.aging_ms, int | float) or self.aging_ms <= 0:
            raise ManifestError("aging_ms", "must be a number of milliseconds > 0")


@dataclass(frozen=True)
class ResultCacheConfig:
    """Opt-in cache of outputs by a hash of the inputs, for deterministic handlers.

    ``backend = "memory"``: each node keeps its own, bounded by ``max_bytes``.
    ``"redis"``: one cache every node shares, in the Redis of ``fnrt serve
    --redis-url`` (entries past ``max_bytes`` are not stored; Redis's own
    ``maxmemory-policy`` evicts); a node without one keeps a memory cache.
    """

    enabled: bool = False
    max_bytes: int = 64 * 1024 * 1024
    ttl_s: float = 60.0
    backend: str = "memory"

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ManifestError("enabled", "must be true or false")
        if self.backend not in ("memory", "redis"):
            raise ManifestError("backend", f"{self.backend!r} is not 'memory' or 'redis'")
        if not isinstance(self.max_bytes, int) or self.max_bytes < 1:
            raise ManifestError("max_bytes", "must be a positive integer")
        if not isinstance(self.ttl_s, int | float) or self.ttl_s <= 0:
            raise ManifestError("ttl_s", "must be a number of seconds > 0")


ROLLOUT_POLICIES = ("immediate", "canary")


@dataclass(frozen=True)
class RolloutConfig:
    """How a new version takes over from the one serving (blue/green, then a policy).

    Before any traffic, the new version is loaded, ``warmup_file``'s requests
    are run through it, and ``probe_file``'s requests must give their expected
    outputs within ``probe_atol`` + ``probe_rtol`` * |expected|. Then
    ``immediate`` moves all traffic at once; ``canary`` walks ``steps_percent``,
    dwelling ``dwell_s`` at each, and rolls back on its own when the new
    version's error rate exceeds the old one's by ``max_error_rate`` or its p99
    passes ``max_p99_ratio`` times the old one's (plus ``p99_slack_ms``), once
    it has served ``min_requests``. The version cut over from stays loaded for
    ``rollback_window_s``. ``sticky_header`` names a request header whose value
    always maps to the same version during a split.
    """

    policy: str = "immediate"
    steps_percent: tuple[int, ...] = (10, 50, 100)
    dwell_s: float = 30.0
    min_requests: int = 20
    max_error_rate: float = 0.05
    max_p99_ratio: float = 2.0
    p99_slack_ms: float = 5.0
    rollback_window_s: float = 600.0
    sticky_header: str = ""
    warmup_file: str = ""
    probe_file: str = ""
    probe_atol: float = 1e-5
    probe_rtol: float = 1e-4

    def __post_init__(self) -> None:
        if self.policy not in ROLLOUT_POLICIES:
            raise ManifestError("policy", f"must be one of {list(ROLLOUT_POLICIES)}")
        steps = self.steps_percent
        if (
            not isinstance(steps, tuple | list)
            or not steps
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in steps)
            or list(steps) != sorted(set(steps))
            or steps[0] < 1
            or steps[-1] != 100
        ):
            raise ManifestError(
                "steps_percent", "must be increasing integer percentages ending at 100"
            )
        object.__setattr__(self, "steps_percent", tuple(steps))
        for name in ("dwell_s", "p99_slack_ms", "rollback_window_s", "probe_atol", "probe_rtol"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ManifestError(name, "must be a number >= 0")
        if not isinstance(self.min_requests, int) or self.min_requests < 1:
            raise ManifestError("min_requests", "must be an integer >= 1")
        if not isinstance(self.max_error_rate, int | float) or not 0 <= self.max_error_rate <= 1:
            raise ManifestError("max_error_rate", "must be a fraction from 0 to 1")
        if not isinstance(self.max_p99_ratio, int | float) or self.max_p99_ratio < 1:
            raise ManifestError("max_p99_ratio", "must be a number >= 1")
        for name in ("sticky_header", "warmup_file", "probe_file"):
            if not isinstance(getattr(self, name), str):
                raise ManifestError(name, "must be a string")
        for name in ("warmup_file", "probe_file"):
            path = PurePosixPath(getattr(self, name))
            if getattr(self, name) and (path.is_absolute() or ".." in path.parts):
                raise ManifestError(name, "must be a relative path inside the function folder")


#: Bytes of failed requests' inputs a version keeps by default.
FAILED_INPUTS_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class BreakerConfig:
    """The circuit breaker of each version.

    It opens when, over the last ``window_s`` (and at least ``min_requests``),
    more than ``open_error_rate`` of requests failed on the server's side;
    while open, requests get the ``fallback`` at once: ``"cache"`` (the last
    result computed for the same inputs), ``"function:NAME"`` (another
    function, e.g. a smaller model), or ``""`` (a fast 503). After ``open_s``
    it lets ``half_open_probes`` requests through; it closes when fewer than
    ``close_error_rate`` of them failed, else opens again. The inputs of the
    newest ``failed_inputs_kept`` failed requests are kept for the admin API,
    within ``failed_inputs_bytes`` in all (older ones go first; a request larger
    than that alone is kept without its inputs).
    """

    enabled: bool = True
    window_s: float = 30.0
    min_requests: int = 20
    open_error_rate: float = 0.05
    close_error_rate: float = 0.01
    open_s: float = 5.0
    half_open_probes: int = 20
    fallback: str = ""
    failed_inputs_kept: int = 32
    cache_bytes: int = 16 * 1024 * 1024
    failed_inputs_bytes: int = FAILED_INPUTS_BYTES

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ManifestError("enabled", "must be true or false")
        for name in ("window_s", "open_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ManifestError(name, "must be a number of seconds > 0")
        for name in ("open_error_rate", "close_error_rate"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 < value <= 1:
                raise ManifestError(name, "must be a fraction above 0, at most 1")
        for name in ("min_requests", "half_open_probes", "cache_bytes", "failed_inputs_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ManifestError(name, "must be an integer >= 1")
        if not isinstance(self.failed_inputs_kept, int) or self.failed_inputs_kept < 0:
            raise ManifestError("failed_inputs_kept", "must be an integer >= 0")
        if not isinstance(self.fallback, str) or not (
            self.fallback in ("", "cache")
            or (
                self.fallback.startswith("function:")
                and NAME_PATTERN.match(self.fallback[len("function:") :])
            )
        ):
            raise ManifestError("fallback", "must be '', 'cache' or 'function:NAME'")

    @property
    def fallback_function(self) -> str | None:
        return self.fallback[len("function:") :] if self.fallback.startswith("function:") else None


@dataclass(frozen=True)
class SplitConfig:
    """Where a model may be cut between an edge device and fnrt (docs/edge.md).

    ``model`` names the artifact (an ONNX file) that is cut; ``points`` are
    tensor names of that graph, in order from the input to the output, each a
    boundary where the whole state passes through one tensor (for an
    ``nn.Sequential`` exported with :func:`fnrt.edge.export.export_sequential`,
    the layer boundaries ``after.0``, ``after.1`` ...). Split ``k`` (1 to
    ``len(points)``) runs up to ``points[k - 1]`` on the device and the rest
    here; 0 is all on the server, ``len(points) + 1`` all on the device.
    """

    model: str = ""
    points: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        points = self.points
        if not isinstance(points, tuple | list) or not all(isinstance(p, str) for p in points):
            raise ManifestError("points", "must be a list of tensor names")
        object.__setattr__(self, "points", tuple(points))
        for point in points:
            if not _TENSOR_NAME.match(point):
                raise ManifestError("points", f"{point!r} is not a valid tensor name")
        if len(set(points)) != len(points):
            raise ManifestError("points", "names a tensor twice")
        if not isinstance(self.model, str):
            raise ManifestError("model", "must be the name of an artifact")
        if bool(self.model) != bool(points):
            raise ManifestError("model", "and 'points' go together: name the model and its cuts")

    @property
    def enabled(self) -> bool:
        return bool(self.points)


@dataclass(frozen=True)
class EnvironmentConfig:
    """A Python environment of the function's own (docs/environments.md).

    ``requirements`` are pip requirement specifiers (``"humanize==4.9.0"``,
    ``"scipy>=1.11"``, ``"pkg @ https://..."``); ``requirements_file`` names a
    file in the function folder whose lines are added to them when the folder
    is deployed. What the node lacks is installed at deploy into a folder
    shared by every function that resolves alike; the function's instances run
    in worker processes with it first on their path.
    """

    requirements: tuple[str, ...] = ()
    requirements_file: str = ""

    def __post_init__(self) -> None:
        reqs = self.requirements
        if not isinstance(reqs, tuple | list) or not all(isinstance(r, str) for r in reqs):
            raise ManifestError("requirements", "must be a list of requirement strings")
        cleaned = tuple(r.strip() for r in reqs)
        object.__setattr__(self, "requirements", cleaned)
        for req in cleaned:
            if not req or "\n" in req or req.startswith("-"):
                raise ManifestError(
                    "requirements",
                    f"{req!r}: one requirement specifier each (pip options are not taken)",
                )
        rel = self.requirements_file
        if not isinstance(rel, str) or PurePosixPath(rel).is_absolute() or ".." in rel:
            raise ManifestError("requirements_file", "must be a path inside the function folder")

    @property
    def enabled(self) -> bool:
        return bool(self.requirements)


def read_requirements(path: Path) -> tuple[str, ...]:
    """The requirement lines of a requirements file (comments and blank lines dropped)."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.split(" #", 1)[0].strip()
        if text and not text.startswith("#"):
            lines.append(text)
    return tuple(lines)


class IsolationMode(Enum):
    """Where a function's instances run."""

    THREAD = "thread"  # a thread of the server's process
    PROCESS = "process"  # a worker process of its own per instance (the default)


#: Where instances run when neither the manifest nor the node says (``fnrt serve
#: --isolation``). Process mode measured within 3% of thread mode (docs/isolation.md).
DEFAULT_ISOLATION = IsolationMode.PROCESS


@dataclass(frozen=True)
class IsolationConfig:
    """How a function's instances are kept apart from the node and each other.

    ``mode = "process"`` runs each instance in a worker process: a handler that
    crashes, exits or leaks takes down only its worker, which is restarted
    after ``restart_backoff_s`` (doubling while it keeps dying, up to
    ``max_backoff_s``). ``mode = "thread"`` runs it in a thread of the server.
    Left empty, the node's default applies (``fnrt serve --isolation``, process
    unless set), or process when ``memory_limit_bytes`` is set.

    ``timeout_s`` (0: none) bounds one batch: past it the batch's requests get
    a 504 and the instance is replaced (a worker is killed; a thread, which
    cannot be killed, is abandoned). ``memory_limit_bytes`` (process mode, 0:
    none) kills a worker whose resident memory passes it.
    """

    mode: str = ""  # "": the node's default
    timeout_s: float = 0.0
    memory_limit_bytes: int = 0
    restart_backoff_s: float = 0.5
    max_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        modes = [m.value for m in IsolationMode]
        if self.mode and self.mode not in modes:
            raise ManifestError("mode", f"{self.mode!r} is not one of {modes}")
        for name in ("timeout_s", "restart_backoff_s", "max_backoff_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ManifestError(name, "must be a number of seconds >= 0")
        limit = self.memory_limit_bytes
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ManifestError("memory_limit_bytes", "must be an integer >= 0 (0: no limit)")
        if limit and self.mode == IsolationMode.THREAD.value:
            raise ManifestError(
                "memory_limit_bytes", "needs mode = 'process' (a thread's memory is the server's)"
            )

    def kind_under(self, default: IsolationMode = DEFAULT_ISOLATION) -> IsolationMode:
        """Where instances run on a node whose default is ``default``."""
        if self.mode:
            return IsolationMode(self.mode)
        return IsolationMode.PROCESS if self.memory_limit_bytes else default

    def backoff_s(self, failures: int) -> float:
        """How long to wait before restarting after ``failures`` failures in a row."""
        if failures <= 0:
            return 0.0
        return float(min(self.restart_backoff_s * 2 ** (failures - 1), self.max_backoff_s))


@dataclass(frozen=True)
class Manifest:
    """A validated function manifest (see the module docstring for the file form)."""

    name: str
    handler: str
    description: str = ""
    artifacts: Mapping[str, str] = field(default_factory=dict)
    inputs: Mapping[str, TensorSpec] = field(default_factory=dict)
    outputs: Mapping[str, TensorSpec] = field(default_factory=dict)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    requests: RequestsConfig = field(default_factory=RequestsConfig)
    result_cache: ResultCacheConfig = field(default_factory=ResultCacheConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    isolation: IsolationConfig = field(default_factory=IsolationConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_name(self.name)
        module, _, attr = self.handler.partition(":")
        if not _MODULE.match(module) or not _IDENTIFIER.match(attr):
            raise ManifestError(
                "handler", f"{self.handler!r} must be 'module:attribute', e.g. 'handler:Model'"
            )
        for key, rel in self.artifacts.items():
            if not _IDENTIFIER.match(key):
                raise ManifestError(f"artifacts.{key}", "artifact names are Python identifiers")
            path = PurePosixPath(rel)
            if not rel or path.is_absolute() or ".." in path.parts:
                raise ManifestError(
                    f"artifacts.{key}",
                    f"{rel!r} must be a relative path inside the function folder",
                )
        if self.environment.enabled and self.isolation.mode == IsolationMode.THREAD.value:
            raise ManifestError(
                "environment",
                "needs isolation.mode = 'process' (a thread shares the server's packages)",
            )
        if self.split.enabled and self.split.model not in self.artifacts:
            raise ManifestError("split.model", f"{self.split.model!r} is not an artifact")
        for section, specs in (("inputs", self.inputs), ("outputs", self.outputs)):
            for tensor in specs:
                if not _TENSOR_NAME.match(tensor):
                    raise ManifestError(f"{section}.{tensor}", "is not a valid tensor name")

    @property
    def module(self) -> str:
        return self.handler.partition(":")[0]

    def isolation_kind(self, default: IsolationMode = DEFAULT_ISOLATION) -> IsolationMode:
        """Where instances run on a node whose default is ``default`` (a function with an
        environment of its own always in a worker process)."""
        if self.environment.enabled:
            return IsolationMode.PROCESS
        return self.isolation.kind_under(default)

    @property
    def attribute(self) -> str:
        return self.handler.partition(":")[2]

    def to_dict(self) -> dict[str, Any]:
        """The manifest as plain data; ``parse_manifest(m.to_dict()) == m``."""
        return {
            "name": self.name,
            "handler": self.handler,
            "description": self.description,
            "artifacts": dict(sorted(self.artifacts.items())),
            "inputs": {k: v.to_dict() for k, v in self.inputs.items()},
            "outputs": {k: v.to_dict() for k, v in self.outputs.items()},
            "batching": asdict(self.batching),
            "scaling": asdict(self.scaling),
            "requests": asdict(self.requests),
            # backend only when not "memory": versions deployed before it keep their ids
            "result_cache": {
                k: v
                for k, v in asdict(self.result_cache).items()
                if k != "backend" or v != "memory"
            },
            "rollout": {**asdict(self.rollout), "steps_percent": list(self.rollout.steps_percent)},
            # failed_inputs_bytes only when set: versions deployed before it keep their ids
            "breaker": {
                k: v
                for k, v in asdict(self.breaker).items()
                if k != "failed_inputs_bytes" or v != FAILED_INPUTS_BYTES
            },
            # Only when set, so versions deployed before [isolation] keep their ids.
            **(
                {"isolation": asdict(self.isolation)} if self.isolation != IsolationConfig() else {}
            ),
            **(
                {"split": {**asdict(self.split), "points": list(self.split.points)}}
                if self.split.enabled
                else {}
            ),
            # Only when set, so versions deployed before [environment] keep their ids.
            **(
                {
                    "environment": {
                        **asdict(self.environment),
                        "requirements": list(self.environment.requirements),
                    }
                }
                if self.environment != EnvironmentConfig()
                else {}
            ),
            "exclude": list(self.exclude),
        }


_TOP_KEYS = {
    "name",
    "handler",
    "description",
    "artifacts",
    "inputs",
    "outputs",
    "batching",
    "scaling",
    "requests",
    "result_cache",
    "rollout",
    "breaker",
    "split",
    "isolation",
    "environment",
    "exclude",
}


def _table(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ManifestError(key, "must be a table")
    return value


def _build(cls: type[Any], data: Mapping[str, Any], prefix: str) -> Any:
    known = set(cls.__dataclass_fields__)
    for key in data:
        if key not in known:
            raise ManifestError(f"{prefix}.{key}", f"unknown key (known: {sorted(known)})")
    try:
        return cls(**data)
    except ManifestError as exc:
        raise exc.under(prefix) from None


def _tensors(data: Mapping[str, Any], section: str) -> dict[str, TensorSpec]:
    specs: dict[str, TensorSpec] = {}
    for tensor, spec in _table(data, section).items():
        where = f"{section}.{tensor}"
        if not isinstance(spec, Mapping):
            raise ManifestError(where, "must be a table with 'dtype' and 'shape'")
        if "dtype" not in spec or "shape" not in spec:
            raise ManifestError(where, "needs both 'dtype' and 'shape'")
        shape = spec["shape"]
        if not isinstance(shape, list | tuple):
            raise ManifestError(f"{where}.shape", "must be a list of integers")
        specs[tensor] = _build(TensorSpec, {**spec, "shape": tuple(shape)}, where)
    return specs


def parse_manifest(data: Mapping[str, Any], *, name: str | None = None) -> Manifest:
    """Validate plain data (from TOML or JSON) into a :class:`Manifest`.

    ``name`` overrides the manifest's own name (``fnrt deploy --name``).
    """
    if not isinstance(data, Mapping):
        raise ManifestError("manifest", f"must be a table, got {type(data).__name__}")
    for key in data:
        if key not in _TOP_KEYS:
            raise ManifestError(key, f"unknown key (known: {sorted(_TOP_KEYS)})")
    chosen = name if name is not None else data.get("name")
    if chosen is None:
        raise ManifestError("name", "is required (or pass --name)")
    if "handler" not in data:
        raise ManifestError("handler", "is required, e.g. handler = 'handler:Model'")
    for key in ("handler", "description"):
        if key in data and not isinstance(data[key], str):
            raise ManifestError(key, "must be a string")
    artifacts = _table(data, "artifacts")
    for key, rel in artifacts.items():
        if not isinstance(rel, str):
            raise ManifestError(f"artifacts.{key}", "must be a path string")
    exclude = data.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
        raise ManifestError("exclude", "must be a list of glob patterns")
    return Manifest(
        name=check_name(chosen),
        handler=data["handler"],
        description=data.get("description", ""),
        artifacts=dict(artifacts),
        inputs=_tensors(data, "inputs"),
        outputs=_tensors(data, "outputs"),
        batching=_build(BatchingConfig, _table(data, "batching"), "batching"),
        scaling=_build(ScalingConfig, _table(data, "scaling"), "scaling"),
        requests=_build(RequestsConfig, _table(data, "requests"), "requests"),
        result_cache=_build(ResultCacheConfig, _table(data, "result_cache"), "result_cache"),
        rollout=_build(RolloutConfig, _table(data, "rollout"), "rollout"),
        breaker=_build(BreakerConfig, _table(data, "breaker"), "breaker"),
        split=_build(SplitConfig, _table(data, "split"), "split"),
        isolation=_build(IsolationConfig, _table(data, "isolation"), "isolation"),
        environment=_build(EnvironmentConfig, _table(data, "environment"), "environment"),
        exclude=tuple(exclude),
    )


def load_manifest(folder: Path, *, name: str | None = None) -> Manifest:
    """Read and validate ``folder/fnrt.toml``; artifacts must exist in the folder."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise ManifestError(MANIFEST_FILE, f"no {MANIFEST_FILE} in {folder}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(MANIFEST_FILE, f"is not valid TOML: {exc}") from None
    manifest = parse_manifest(data, name=name)
    for key, rel in manifest.artifacts.items():
        if not (folder / rel).exists():
            raise ManifestError(f"artifacts.{key}", f"{rel!r} does not exist in {folder}")
    for key in ("warmup_file", "probe_file"):
        rel = getattr(manifest.rollout, key)
        if rel and not (folder / rel).is_file():
            raise ManifestError(f"rollout.{key}", f"{rel!r} does not exist in {folder}")
    rel = manifest.environment.requirements_file
    if rel:  # its lines join the requirements: the stored manifest holds them all
        if not (folder / rel).is_file():
            raise ManifestError(
                "environment.requirements_file", f"{rel!r} does not exist in {folder}"
            )
        env = manifest.environment
        merged = EnvironmentConfig(env.requirements + read_requirements(folder / rel), rel)
        manifest = replace(manifest, environment=merged)
    return manifest
