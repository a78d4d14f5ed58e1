"""Generative functions: the step-wise handler contract (docs/generation.md).

A generative handler answers each request over many steps, a chunk at a
time (a token, a denoising step). It is a class with two methods besides
``load``::

    class TinyLM(fnrt.Generator):
        def load(self, artifacts, device): ...

        def start(self, sequences):      # prefill: these sequences join now
            return [fnrt.Chunk({"token": first_token(s)}) for s in sequences]

        def step(self, sequences):       # decode: one step of every active sequence
            return [fnrt.Chunk({"token": t}, done=t == EOS) for s, t in ...]

        def stop(self, sequences):       # optional: these left (finished, cancelled)
            ...

fnrt calls them on the instance's own thread, one call at a time: between
two steps it admits waiting requests (``start``) and drops finished and
cancelled ones (``stop``), so the batch a step runs on changes as sequences
come and go (continuous batching, as in Orca and vLLM). Per-sequence state
(a KV cache) belongs to the handler: keep it in ``sequence.state``, or in a
batched tensor of your own indexed by ``sequence.id``.

This module also holds what crosses from the runtime to an instance per
step (:class:`StepBatch`, :class:`Stepped`) and the checks of a request's
generation parameters, which need no handler.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fnrt.functions.contract import check_constructible
from fnrt.functions.errors import HandlerError, InvalidInput

if TYPE_CHECKING:
    import numpy as np

    from fnrt.functions.manifest import GenerationConfig, TensorSpec
    from fnrt.functions.resources import Artifact, Device, Request

#: Parameters fnrt reads itself; every other one must be declared in
#: ``[generation] parameters`` and goes to the handler.
OWN_PARAMETERS = frozenset({"max_new_tokens", "stream"})

#: Why a sequence ended.
STOP = "stop"  # the handler said it was done
LENGTH = "length"  # it reached its max_new_tokens
DEADLINE = "deadline"  # its deadline passed mid-sequence
CANCELLED = "cancelled"  # its client left


@dataclass(eq=False)
class Sequence:
    """One request being generated, as the handler sees it.

    ``inputs`` are the request's inputs (read-only arrays, as for ``__call__``),
    ``parameters`` the declared generation parameters it asked for (a
    ``temperature``, a ``seed``), ``generated`` the chunks produced so far.
    ``state`` is the handler's own, kept from step to step.
    """

    id: int
    inputs: Request
    parameters: Mapping[str, Any]
    max_new_tokens: int
    generated: int = 0
    state: Any = None


@dataclass(frozen=True)
class Chunk:
    """What one step produced for one sequence: outputs as declared in ``[outputs]``,
    and whether the sequence is finished (``done``)."""

    outputs: Mapping[str, Any]
    done: bool = False


class Generator:
    """Optional base class of a generative handler: override ``start`` and ``step``."""

    def load(self, artifacts: Mapping[str, Artifact], device: Device) -> None:
        """Called once per instance, off the event loop, before any step."""

    def start(self, sequences: list[Sequence]) -> list[Chunk]:
        """Prefill: begin ``sequences`` and return each one's first chunk, in order."""
        raise NotImplementedError("a generative handler must implement start(sequences)")

    def step(self, sequences: list[Sequence]) -> list[Chunk]:
        """Decode: advance every active sequence by one step, in order."""
        raise NotImplementedError("a generative handler must implement step(sequences)")

    def stop(self, sequences: list[Sequence]) -> None:
        """``sequences`` left the batch (finished, cancelled, failed): free their state."""

    def unload(self) -> None:
        """Called when the instance is scaled to zero; release what ``load`` took."""


def check_generator(obj: object, where: str) -> None:
    """Raise HandlerError unless ``obj`` is a generative handler class."""
    if not inspect.isclass(obj):
        raise HandlerError(
            f"{where} must be a class with start(sequences) and step(sequences): the "
            "manifest has a [generation] section"
        )
    for method in ("start", "step"):
        fn = getattr(obj, method, None)
        if fn is None or fn is getattr(Generator, method):
            raise HandlerError(f"generative handler {where} must define {method}(self, sequences)")
        try:
            inspect.signature(fn).bind(None, [])
        except TypeError:
            raise HandlerError(f"{where}.{method} must take one argument: the sequences") from None
    check_constructible(obj, where)


# --- what crosses to an instance per step ---------------------------------------------


@dataclass(frozen=True)
class Joining:
    """A sequence that starts at this step."""

    id: int
    inputs: Request
    parameters: Mapping[str, Any]
    max_new_tokens: int


@dataclass(frozen=True)
class StepBatch:
    """One step of an instance: sequences that join (prefill) and ids that leave
    (cancelled, past their deadline) before it; every other active one steps."""

    joining: list[Joining] = field(default_factory=list)
    leaving: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Stepped:
    """What one step produced: per sequence (by id, in order) its checked outputs and
    why it ended (None: it goes on). Timed like a batch (``Ran``)."""

    ids: list[int]
    outputs: list[dict[str, np.ndarray[Any, Any]]]
    ended: list[str | None]
    infer_s: float = 0.0
    output_s: float = 0.0
    spans: list[dict[str, Any]] = field(default_factory=list)


# --- a request's parameters -----------------------------------------------------------


@dataclass(frozen=True)
class Asked:
    """A generate request's parameters, checked: what the handler gets, the token
    limit, whether the answer streams (None: not said, the Accept header decides)."""

    parameters: dict[str, Any]
    max_new_tokens: int
    stream: bool | None = None


def parse_parameters(config: GenerationConfig, raw: Any) -> Asked:
    """Check a request's ``parameters`` against ``[generation]``; InvalidInput (422)
    naming the parameter at fault."""
    if raw is None:
        return Asked({}, config.max_new_tokens)
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"'parameters' must be a map, got {type(raw).__name__}")
    declared = config.parameters
    handler: dict[str, Any] = {}
    max_new = config.max_new_tokens
    stream: bool | None = None
    for key, value in raw.items():
        name = key.decode() if isinstance(key, bytes) else str(key)
        if name == "max_new_tokens":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise _bad(name, f"must be a positive integer, got {value!r}")
            if value > config.max_new_tokens:
                limit = config.max_new_tokens
                raise _bad(name, f"{value} is over this function's limit of {limit}")
            max_new = value
        elif name == "stream":
            if not isinstance(value, bool):
                raise _bad(name, f"must be true or false, got {value!r}")
            stream = value
        elif name in declared:
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            if not isinstance(value, bool | int | float | str):
                kind = type(value).__name__
                raise _bad(name, f"must be a number, a string or a boolean, got {kind}")
            handler[name] = value
        else:
            known = sorted(OWN_PARAMETERS | set(declared))
            raise _bad(name, f"is not a parameter of this function (it takes {', '.join(known)})")
    return Asked(handler, max_new, stream)


def _bad(name: str, reason: str) -> InvalidInput:
    error = InvalidInput(f"parameter '{name}' {reason}")
    error.fields["parameter"] = name
    return error


def prompt_tokens(config: GenerationConfig, inputs: Request, default_input: str) -> int:
    """How many tokens a request's prompt counts for (its token budget): the prompt
    input's elements, a ``bytes`` element by its length (an upper bound on the tokens
    of a byte-level or subword tokenizer)."""
    array = inputs.get(config.prompt_input or default_input)
    if array is None:
        return 0
    if array.dtype.kind == "O":
        return sum(len(v) if isinstance(v, bytes | str) else 1 for v in array.reshape(-1))
    return int(array.size)


def check_prompt(config: GenerationConfig, tokens: int, max_new_tokens: int, name: str) -> None:
    """InvalidInput (422) when a prompt cannot be served: past ``max_prompt_tokens``, or
    with its ``max_new_tokens`` past the whole ``token_budget``."""
    if config.max_prompt_tokens and tokens > config.max_prompt_tokens:
        error = InvalidInput(
            f"the prompt is {tokens} tokens, over this function's limit of "
            f"{config.max_prompt_tokens} (generation.max_prompt_tokens)",
            input=name,
        )
        error.fields.update(prompt_tokens=tokens, limit=config.max_prompt_tokens)
        raise error
    budget = config.token_budget
    if budget and tokens + max_new_tokens > budget:
        error = InvalidInput(
            f"the prompt ({tokens} tokens) and max_new_tokens ({max_new_tokens}) need "
            f"{tokens + max_new_tokens} tokens, over this function's budget of {budget} "
            "(generation.token_budget): ask for fewer new tokens or send a shorter prompt",
            input=name,
        )
        error.fields.update(prompt_tokens=tokens, limit=budget)
        raise error


def join_chunks(
    specs: Mapping[str, TensorSpec], chunks: Iterable[Mapping[str, np.ndarray[Any, Any]]]
) -> dict[str, np.ndarray[Any, Any]]:
    """A sequence's whole result from its chunks: each output's chunks joined along
    their first axis (a 0-d chunk counts as one element); a ``bytes`` output's
    elements joined into one (text pieces become the text)."""
    import numpy as np

    chunks = list(chunks)
    out: dict[str, np.ndarray[Any, Any]] = {}
    for name, spec in specs.items():
        parts = [np.atleast_1d(c[name]) for c in chunks if name in c]
        if spec.dtype == "bytes":
            pieces = [e for p in parts for e in p.reshape(-1)]
            joined = b"".join(e if isinstance(e, bytes) else str(e).encode() for e in pieces)
            whole = np.empty(1, dtype=object)
            whole[0] = joined
            out[name] = whole
        elif parts:
            out[name] = np.concatenate(parts, axis=0)
        else:
            out[name] = np.empty((0,), dtype=spec.dtype)
    return out
