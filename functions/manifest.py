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

Every section is a pydantic dataclass: its fields' types and bounds are
declared once below, and pydantic checks them whenever a manifest is parsed (at
deploy time) or a section is made. The checks between fields (a memory limit in
thread mode, a split model that is no artifact) are the sections'
``__post_init__``. Unknown keys are errors too, so a typo does not silently fall
back to a default; every error is a :class:`ManifestError` naming the field at
fault (:mod:`fnrt.functions.manifest_errors` words pydantic's errors so).
The same declarations give the JSON Schema (:mod:`fnrt.functions.schema`).
"""

from __future__ import annotations

import functools
import re
import tomllib
import typing
from collections.abc import Callable, Mapping
from dataclasses import asdict, field, replace
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, TypeVar, dataclass_transform

import pydantic
import pydantic.dataclasses
from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr

from fnrt.functions.dtypes import DTYPES
from fnrt.functions.errors import ManifestError
from fnrt.functions.manifest_errors import Validator, manifest_error

MANIFEST_FILE = "fnrt.toml"

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HANDLER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
_TENSOR_NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}$")


C = TypeVar("C")

#: Unknown keys are refused; TOML's lists become the sections' tuples; patterns are Python
#: regular expressions (lookahead included, as in the JSON Schema editors read).
_CONFIG = pydantic.ConfigDict(extra="forbid", regex_engine="python-re")


@dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
def section(cls: type[C]) -> type[C]:
    """``cls`` as a frozen pydantic dataclass whose every construction is checked: a
    value that does not fit raises :class:`ManifestError` naming the field."""
    made = pydantic.dataclasses.dataclass(frozen=True, config=_CONFIG)(cls)
    init: Callable[..., None] = made.__init__

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except pydantic.ValidationError as exc:
            raise manifest_error(exc, made) from None

    setattr(made, "__init__", checked)  # noqa: B010 (mypy: a method cannot be assigned)
    return typing.cast(type[C], made)


# Field types: exact TOML/JSON types (no "5" for 5, no true for 1), with bounds.
Int = StrictInt
Number = StrictFloat  # an integer is taken, as a float
Flag = StrictBool
Text = StrictStr
Seconds = Annotated[StrictFloat, Field(ge=0, description="seconds")]
Millis = Annotated[StrictFloat, Field(ge=0, description="milliseconds")]
Fraction = Annotated[StrictFloat, Field(ge=0, le=1)]
GbSeconds = Annotated[StrictFloat, Field(ge=0, description="GB·s")]
Texts = tuple[StrictStr, ...]
TensorName = Annotated[
    Text, Field(pattern=_TENSOR_NAME.pattern, description="a tensor name ([A-Za-z0-9_.:/-])")
]


def check_name(name: str, field_name: str = "name") -> str:
    """Return ``name`` if it is a valid function name, else raise ManifestError."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ManifestError(
            field_name,
            f"{name!r} is not a valid function name "
            "(lowercase letters, digits, '-' and '_', at most 63, starting with a letter or digit)",
        )
    return name


@section
class TensorSpec:
    """One declared input or output: element type and per-request shape.

    ``shape`` includes the leading batch-of-rows dimension a request carries;
    ``-1`` matches any size in that position.
    """

    #: bool, uint8…uint64, int8…int64, float16/32/64, bfloat16 or bytes
    dtype: Annotated[Text, Field(json_schema_extra={"enum": sorted(DTYPES)})]
    #: one size per dimension; -1 matches any size
    shape: tuple[Annotated[StrictInt, Field(ge=-1)], ...]

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ManifestError("dtype", f"{self.dtype!r} is not one of {sorted(DTYPES)}")

    def matches_shape(self, shape: tuple[int, ...]) -> bool:
        # the answer for the few shapes requests carry, looked up: the loop below cost
        # about a microsecond a request
        key = (self.shape, shape)
        matched = _MATCHED.get(key)
        if matched is None:
            if len(_MATCHED) >= _MATCHED_MAX:  # any shapes a client sends: forget them all
                _MATCHED.clear()
            matched = _MATCHED[key] = _matches(self.shape, shape)
        return matched

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape)}


def _matches(declared: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    return len(shape) == len(declared) and all(
        want in (got, -1) for want, got in zip(declared, shape, strict=True)
    )


#: ``matches_shape``'s answers: (declared, got) -> whether they match.
_MATCHED: dict[tuple[tuple[int, ...], tuple[int, ...]], bool] = {}
_MATCHED_MAX = 4096


@section
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

    #: the most requests in one handler call
    max_batch_size: Annotated[Int, Field(ge=1, le=4096)] = 8
    #: how long a partial batch may wait for more (fixed mode; caps the wait in adaptive)
    max_wait_ms: Annotated[Millis, Field(le=60_000)] = 0.0
    #: "fixed": max_batch_size or max_wait_ms; "adaptive": sized from the handler's measured cost
    mode: Literal["fixed", "adaptive"] = "fixed"
    #: adaptive: queue wait + compute to stay under; requests that cannot make it get 503
    target_p99_ms: Annotated[Millis, Field(gt=0, le=600_000)] = 100.0

    @property
    def adaptive(self) -> bool:
        return self.mode == "adaptive"


#: How long an idle instance stays loaded (see docs/prewarm.md): ``fixed`` is
#: ``keep_alive_s``; the others learn from the function's idle times.
KeepAlivePolicy = Literal["auto", "fixed", "histogram", "time_of_day", "trend"]
KEEP_ALIVE_POLICIES: tuple[str, ...] = typing.get_args(KeepAlivePolicy)


@section
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

    #: fixed policy (and auto while it learns): idle seconds before the last instance is dropped
    keep_alive_s: Seconds = 300.0
    #: requests queued for the function before 429 (Retry-After)
    max_queue: Annotated[Int, Field(ge=1, le=1_000_000)] = 256
    #: load when the server starts instead of at the first call
    load_at_start: Flag = False
    #: instances kept loaded whatever the traffic
    min_instances: Annotated[Int, Field(ge=0, le=256)] = 0
    #: instances started while the queue stays deep
    max_instances: Annotated[Int, Field(ge=1, le=256)] = 1
    #: how long a full batch waits before another instance starts
    scale_up_after_ms: Millis = 200.0
    #: idle seconds before an extra instance stops
    scale_down_after_s: Seconds = 30.0
    #: when to drop an idle instance and load it ahead of a call (docs/prewarm.md)
    keep_alive_policy: KeepAlivePolicy = "auto"
    #: what a cold start is worth to ``auto``, in GB·s (unset: the server's price, by
    #: default --cold-start-price-mean-s seconds of the node's mean instance)
    cold_start_price_gb_s: GbSeconds | None = None
    #: or: so many seconds of this function's own instance kept idle
    cold_start_price_s: Seconds | None = None

    def __post_init__(self) -> None:
        if self.min_instances > self.max_instances:
            raise ManifestError("min_instances", "must be an integer from 0 to max_instances")
        if self.cold_start_price_gb_s is not None and self.cold_start_price_s is not None:
            raise ManifestError(
                "cold_start_price_s", "give cold_start_price_gb_s or cold_start_price_s, not both"
            )


Priority = Literal["high", "normal", "low"]
PRIORITIES: tuple[str, ...] = typing.get_args(Priority)


@section
class RequestsConfig:
    """Per-request defaults: priority (``X-Fnrt-Priority`` overrides), timeout
    (``X-Fnrt-Timeout-Ms`` overrides; 0 for none) and how fast waiting requests
    climb a priority class so none starves."""

    #: priority of a request without X-Fnrt-Priority
    default_priority: Priority = "normal"
    #: drop a request not started within this (504); X-Fnrt-Timeout-Ms overrides; 0: none
    timeout_ms: Millis = 0.0
    #: waiting this long lifts a request one priority class
    aging_ms: Annotated[Millis, Field(gt=0)] = 1000.0


@section
class ResultCacheConfig:
    """Opt-in cache of outputs by a hash of the inputs, for deterministic handlers.

    ``backend = "memory"``: each node keeps its own, bounded by ``max_bytes``.
    ``"redis"``: one cache every node shares, in the Redis of ``fnrt serve
    --redis-url`` (entries past ``max_bytes`` are not stored; Redis's own
    ``maxmemory-policy`` evicts); a node without one keeps a memory cache.
    """

    #: cache outputs by a hash of the inputs (deterministic handlers only)
    enabled: Flag = False
    #: the cache's size (memory), or the largest entry stored (redis)
    max_bytes: Annotated[Int, Field(ge=1)] = 64 * 1024 * 1024
    #: how long an entry is served
    ttl_s: Annotated[Seconds, Field(gt=0)] = 60.0
    #: "memory": per node; "redis": shared through fnrt serve --redis-url
    backend: Literal["memory", "redis"] = "memory"


RolloutPolicy = Literal["immediate", "canary"]
ROLLOUT_POLICIES: tuple[str, ...] = typing.get_args(RolloutPolicy)
#: A path inside the function folder ("" for none).
RelativePath = Annotated[
    Text,
    Field(
        pattern=r"^(?!/)(?!(.*/)?\.\.(/|$))",
        description="a relative path inside the function folder",
    ),
]


@section
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

    #: "immediate": all traffic at once; "canary": walk steps_percent, rolling back on errors or p99
    policy: RolloutPolicy = "immediate"
    #: canary: the new version's share at each step, ending at 100
    steps_percent: tuple[Annotated[Int, Field(ge=1, le=100)], ...] = (10, 50, 100)
    #: canary: time at each step
    dwell_s: Seconds = 30.0
    #: canary: requests the new version serves at a step before it is judged
    min_requests: Annotated[Int, Field(ge=1)] = 20
    #: canary: roll back when the new error rate passes the old one's by this
    max_error_rate: Fraction = 0.05
    #: canary: roll back when the new p99 passes the old one's times this (plus p99_slack_ms)
    max_p99_ratio: Annotated[Number, Field(ge=1)] = 2.0
    #: canary: added to the old p99 before the ratio is applied
    p99_slack_ms: Millis = 5.0
    #: the version cut over from stays loaded this long (fnrt rollback is instant)
    rollback_window_s: Seconds = 600.0
    #: a request header whose value always maps to the same version during a split
    sticky_header: Text = ""
    #: requests run through the new version before any traffic
    warmup_file: RelativePath = ""
    #: requests with expected outputs, checked before any traffic (422 when they differ)
    probe_file: RelativePath = ""
    #: probe: absolute tolerance
    probe_atol: Annotated[Number, Field(ge=0)] = 1e-5
    #: probe: tolerance relative to |expected|
    probe_rtol: Annotated[Number, Field(ge=0)] = 1e-4

    def __post_init__(self) -> None:
        steps = self.steps_percent
        if not steps or list(steps) != sorted(set(steps)) or steps[-1] != 100:
            raise ManifestError(
                "steps_percent", "must be increasing integer percentages ending at 100"
            )


#: Bytes of failed requests' inputs a version keeps by default.
FAILED_INPUTS_BYTES = 16 * 1024 * 1024


@section
class BreakerConfig:
    """The circuit breaker of each version.

    It opens when, over the last ``window_s`` (and at least ``min_requests``),
    more than ``open_error_rate`` of requests failed on the server's side;
    while open, requests get the ``fallback`` at once: ``"cache"`` (the last
    result computed for the same inputs), ``"function:NAME"`` (another
    function, e.g. a smaller model), or ``""`` (a fast 503). After ``open_s``
    it lets ``half_open_probes`` requests through; it closes when fewer than
    ``close_error_rate`` of them failed, else opens again. It also opens after
    ``open_after_deaths`` instances died in a row (crashed, killed, past their
    timeout, or failed to load; 0: never for that alone), however few requests
    there were, and stays open while the instance's restart backs off. The inputs of the
    newest ``failed_inputs_kept`` failed requests are kept for the admin API,
    within ``failed_inputs_bytes`` in all (older ones go first; a request larger
    than that alone is kept without its inputs).
    """

    #: a circuit breaker for each version
    enabled: Flag = True
    #: the window the error rate is measured over
    window_s: Annotated[Seconds, Field(gt=0)] = 30.0
    #: requests in the window before the breaker may open
    min_requests: Annotated[Int, Field(ge=1)] = 20
    #: opens past this share of server-side failures
    open_error_rate: Annotated[Fraction, Field(gt=0)] = 0.05
    #: closes when fewer of the half-open probes than this failed
    close_error_rate: Annotated[Fraction, Field(gt=0)] = 0.01
    #: how long it stays open before letting probes through
    open_s: Annotated[Seconds, Field(gt=0)] = 5.0
    #: requests let through to test a version that was failing
    half_open_probes: Annotated[Int, Field(ge=1)] = 20
    #: instances dead in a row that open it, however few requests (0: never for that alone)
    open_after_deaths: Annotated[Int, Field(ge=0)] = 3
    fallback: Annotated[
        Text,
        Field(
            pattern=f"^(|cache|function:{NAME_PATTERN.pattern[1:-1]})$",
            description="'', 'cache' or 'function:NAME'",
        ),
    ] = ""
    #: the newest failed requests whose inputs are kept (fnrt failures)
    failed_inputs_kept: Annotated[Int, Field(ge=0)] = 32
    #: the "cache" fallback's size: last results by inputs
    cache_bytes: Annotated[Int, Field(ge=1)] = 16 * 1024 * 1024
    #: the kept failed inputs' bytes in all
    failed_inputs_bytes: Annotated[Int, Field(ge=1)] = FAILED_INPUTS_BYTES

    @property
    def fallback_function(self) -> str | None:
        return self.fallback[len("function:") :] if self.fallback.startswith("function:") else None


@section
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

    #: the ONNX artifact that is cut
    model: Text = ""
    #: tensor names of that graph to cut at, from the input to the output
    points: tuple[TensorName, ...] = ()

    def __post_init__(self) -> None:
        points = self.points
        if len(set(points)) != len(points):
            raise ManifestError("points", "names a tensor twice")
        if bool(self.model) != bool(points):
            raise ManifestError("model", "and 'points' go together: name the model and its cuts")

    @property
    def enabled(self) -> bool:
        return bool(self.points)


@section
class EnvironmentConfig:
    """A Python environment of the function's own (docs/environments.md).

    ``requirements`` are pip requirement specifiers (``"humanize==4.9.0"``,
    ``"scipy>=1.11"``, ``"pkg @ https://..."``); ``requirements_file`` names a
    file in the function folder whose lines are added to them when the folder
    is deployed. What the node lacks is installed at deploy into a folder
    shared by every function that resolves alike; the function's instances run
    in worker processes with it first on their path.
    """

    #: pip requirement specifiers installed at deploy
    requirements: Texts = ()
    requirements_file: RelativePath = ""

    def __post_init__(self) -> None:
        cleaned = tuple(r.strip() for r in self.requirements)
        object.__setattr__(self, "requirements", cleaned)
        for req in cleaned:
            if not req or "\n" in req or req.startswith("-"):
                raise ManifestError(
                    "requirements",
                    f"{req!r}: one requirement specifier each (pip options are not taken)",
                )

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


@section
class GenerationConfig:
    """A generative function: answered step by step, with continuous batching
    (docs/generation.md). Its presence makes the function generative: the handler
    is a class with ``start`` and ``step`` (``fnrt.Generator``).

    Between two steps, waiting requests join while fewer than ``max_active``
    sequences run and their tokens (prompt plus ``max_new_tokens`` each) fit in
    ``token_budget`` (0: no budget). ``max_new_tokens`` is the most a request may
    ask for, and what it gets when it asks for nothing; ``max_prompt_tokens`` (0:
    only the budget bounds it) refuses longer prompts. A prompt's tokens are the
    elements of ``prompt_input`` (default: the first input; a ``bytes`` element
    counts its length). ``parameters`` names what else a request may set (a
    ``temperature``, a ``seed``); anything else is refused with a 422.
    """

    #: sequences in one step batch
    max_active: Annotated[Int, Field(ge=1, le=4096)] = 8
    #: tokens (prompts plus max_new_tokens) of the running sequences (0: no budget)
    token_budget: Annotated[Int, Field(ge=0)] = 0
    #: the most a request may ask for, and what it gets when it asks for none
    max_new_tokens: Annotated[Int, Field(ge=1, le=1_000_000)] = 256
    #: longer prompts are refused (0: only the budget bounds them)
    max_prompt_tokens: Annotated[Int, Field(ge=0)] = 0
    #: the input whose elements are the prompt's tokens (default: the first)
    prompt_input: Text = ""
    #: what else a request may set (temperature, seed); others get 422
    parameters: Texts = ()

    def __post_init__(self) -> None:
        for name in self.parameters:
            if not _IDENTIFIER.match(name):
                raise ManifestError("parameters", f"{name!r} is not an identifier")
            if name in ("max_new_tokens", "stream"):
                raise ManifestError("parameters", f"{name!r} is fnrt's own: leave it out")
        if self.token_budget and self.token_budget <= self.max_new_tokens:
            raise ManifestError(
                "token_budget",
                f"{self.token_budget} leaves no room for a prompt beside max_new_tokens "
                f"({self.max_new_tokens})",
            )


class IsolationMode(Enum):
    """Where a function's instances run."""

    THREAD = "thread"  # a thread of the server's process
    PROCESS = "process"  # a worker process of its own per instance (the default)


#: Where instances run when neither the manifest nor the node says (``fnrt serve
#: --isolation``). Process mode measured within 3% of thread mode (docs/isolation.md).
DEFAULT_ISOLATION = IsolationMode.PROCESS


@section
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

    #: "process": a worker process per instance; "thread": a thread of the server; "": the
    #: node's default (fnrt serve --isolation: process unless set)
    mode: Literal["", "thread", "process"] = ""
    #: a batch running past it gets 504 and the instance is replaced (0: none)
    timeout_s: Seconds = 0.0
    memory_limit_bytes: Annotated[Int, Field(ge=0)] = 0  # 0: no limit
    #: wait before restarting a worker that died, doubling while it keeps dying
    restart_backoff_s: Seconds = 0.5
    #: the longest wait between restarts
    max_backoff_s: Seconds = 30.0

    def __post_init__(self) -> None:
        if self.memory_limit_bytes and self.mode == IsolationMode.THREAD.value:
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


@section
class Manifest:
    """A validated function manifest (see the module docstring for the file form)."""

    name: Annotated[
        Text,
        Field(
            pattern=NAME_PATTERN.pattern,
            description="a function name: lowercase letters, digits, '-' and '_', at most 63, "
            "starting with a letter or digit (it is the function's URL)",
        ),
    ]
    handler: Annotated[
        Text,
        Field(
            pattern=_HANDLER_PATTERN,
            description="'module:attribute' of the handler class or function, e.g. 'handler:Model'",
        ),
    ]
    #: free text shown by fnrt describe and the OpenAPI document
    description: Text = ""
    artifacts: Annotated[
        Mapping[str, Text],
        Field(description="name -> a file or folder in the function folder (memory-mapped)"),
    ] = field(default_factory=dict)
    inputs: Annotated[
        Mapping[TensorName, TensorSpec],
        Field(description="name -> {dtype, shape}; -1 is any length"),
    ] = field(default_factory=dict)
    outputs: Annotated[
        Mapping[TensorName, TensorSpec],
        Field(description="name -> {dtype, shape}; -1 is any length"),
    ] = field(default_factory=dict)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    requests: RequestsConfig = field(default_factory=RequestsConfig)
    result_cache: ResultCacheConfig = field(default_factory=ResultCacheConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    isolation: IsolationConfig = field(default_factory=IsolationConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    generation: GenerationConfig | None = None
    exclude: Annotated[Texts, Field(description="glob patterns left out of the code bundle")] = ()

    def __post_init__(self) -> None:
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
        if self.generation is not None:
            self._check_generation(self.generation)

    def _check_generation(self, generation: GenerationConfig) -> None:
        if not self.inputs or not self.outputs:
            raise ManifestError("generation", "needs declared [inputs] and [outputs]")
        if generation.prompt_input and generation.prompt_input not in self.inputs:
            raise ManifestError(
                "generation.prompt_input", f"{generation.prompt_input!r} is not an input"
            )
        if "parameters" in self.inputs:
            raise ManifestError("inputs.parameters", "is the generation parameters' key")
        if self.result_cache.enabled:
            raise ManifestError("result_cache", "does not apply to a generative function")
        if self.split.enabled:
            raise ManifestError("split", "does not apply to a generative function")

    @property
    def generative(self) -> bool:
        return self.generation is not None

    @property
    def prompt_input(self) -> str:
        """The input whose elements count as a generative function's prompt tokens."""
        assert self.generation is not None
        return self.generation.prompt_input or next(iter(self.inputs))

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
            # unset prices left out: TOML has no null, and versions keep their ids
            "scaling": {k: v for k, v in asdict(self.scaling).items() if v is not None},
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
            # Only when set: a function without it is not generative.
            **(
                {
                    "generation": {
                        **asdict(self.generation),
                        "parameters": list(self.generation.parameters),
                    }
                }
                if self.generation is not None
                else {}
            ),
            "exclude": list(self.exclude),
        }


def parse_manifest(data: Mapping[str, Any], *, name: str | None = None) -> Manifest:
    """Validate plain data (from TOML or JSON) into a :class:`Manifest`.

    ``name`` overrides the manifest's own name (``fnrt deploy --name``).
    """
    if not isinstance(data, Mapping):
        raise ManifestError("manifest", f"must be a table, got {type(data).__name__}")
    chosen = name if name is not None else data.get("name")
    if chosen is None:
        raise ManifestError("name", "is required (or pass --name)")
    if "handler" not in data:
        raise ManifestError("handler", "is required, e.g. handler = 'handler:Model'")
    return _validator().validate({**data, "name": chosen})


@functools.cache
def _validator() -> Validator[Manifest]:
    """Manifests from plain data (made on first use)."""
    return Validator(Manifest)


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
