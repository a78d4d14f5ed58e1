"""The generative contract's pure parts: parameters, prompt bounds, joining chunks,
the handler check, and the manifest's [generation] section."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from fnrt.functions.errors import HandlerError, InvalidInput, ManifestError
from fnrt.functions.generation import (
    Chunk,
    Generator,
    check_generator,
    check_prompt,
    join_chunks,
    parse_parameters,
    prompt_tokens,
)
from fnrt.functions.manifest import GenerationConfig, TensorSpec, parse_manifest

CONFIG = GenerationConfig(max_new_tokens=20, parameters=("temperature", "seed"))


def test_parameters_are_checked_against_the_declaration() -> None:
    asked = parse_parameters(CONFIG, {"temperature": 0.5, "seed": 3, "max_new_tokens": 7})
    assert asked.parameters == {"temperature": 0.5, "seed": 3}
    assert asked.max_new_tokens == 7 and asked.stream is None
    assert parse_parameters(CONFIG, None).max_new_tokens == 20  # the function's default
    assert parse_parameters(CONFIG, {"stream": True}).stream is True
    assert parse_parameters(CONFIG, {b"seed": b"x"}).parameters == {"seed": "x"}  # msgpack


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"top_p": 1}, "not a parameter of this function (it takes max_new_tokens, seed"),
        ({"max_new_tokens": 21}, "over this function's limit of 20"),
        ({"max_new_tokens": True}, "positive integer"),
        ({"max_new_tokens": 2.5}, "positive integer"),
        ({"stream": "yes"}, "true or false"),
        ({"seed": {"a": 1}}, "a number, a string or a boolean"),
        ([1, 2], "must be a map"),
    ],
)
def test_bad_parameters_name_what_is_wrong(raw: Any, says: str) -> None:
    with pytest.raises(InvalidInput, match=re.escape(says)) as caught:
        parse_parameters(CONFIG, raw)
    assert caught.value.to_dict()["error"]


def test_prompt_tokens_count_elements_or_bytes() -> None:
    config = GenerationConfig()
    text = np.empty(1, dtype=object)
    text[0] = "héllo".encode()
    assert prompt_tokens(config, {"prompt": text}, "prompt") == 6  # UTF-8 bytes
    assert prompt_tokens(config, {"ids": np.arange(12).reshape(3, 4)}, "ids") == 12
    assert prompt_tokens(GenerationConfig(prompt_input="ids"), {"ids": np.arange(3)}, "x") == 3


def test_prompts_past_their_bounds_are_refused() -> None:
    config = GenerationConfig(max_new_tokens=10, max_prompt_tokens=5, token_budget=12)
    check_prompt(config, 2, 10, "p")
    with pytest.raises(InvalidInput, match="over this function's limit of 5") as long:
        check_prompt(config, 6, 1, "p")
    assert long.value.fields == {"input": "p", "prompt_tokens": 6, "limit": 5}
    with pytest.raises(InvalidInput, match="budget of 12"):
        check_prompt(config, 3, 10, "p")


def test_chunks_join_along_their_first_axis_and_text_into_one() -> None:
    specs = {
        "token": TensorSpec("int64", (1,)),
        "text": TensorSpec("bytes", (1,)),
        "vec": TensorSpec("float32", (-1, 2)),
    }
    pieces = [b"he", b"llo"]
    chunks = []
    for i, piece in enumerate(pieces):
        text = np.empty(1, dtype=object)
        text[0] = piece
        vec = np.full((1, 2), i, np.float32)
        chunks.append({"token": np.array([i]), "text": text, "vec": vec})
    whole = join_chunks(specs, iter(chunks))  # any iterable
    assert whole["token"].tolist() == [0, 1]
    assert whole["text"].tolist() == [b"hello"]
    assert whole["vec"].shape == (2, 2)
    empty = join_chunks(specs, [])
    assert empty["token"].shape == (0,) and empty["text"].tolist() == [b""]


class Good(Generator):
    def start(self, sequences: list[Any]) -> list[Chunk]:
        return []

    def step(self, sequences: list[Any]) -> list[Chunk]:
        return []


class NoStep(Generator):
    def start(self, sequences: list[Any]) -> list[Chunk]:
        return []


class Arguments(Good):
    def __init__(self, size: int) -> None:
        self.size = size


def test_the_generator_contract_is_checked() -> None:
    check_generator(Good, "h:Good")
    with pytest.raises(HandlerError, match="must define step"):
        check_generator(NoStep, "h:NoStep")
    with pytest.raises(HandlerError, match="constructible with no arguments"):
        check_generator(Arguments, "h:Arguments")
    with pytest.raises(HandlerError, match="must be a class"):
        check_generator(lambda batch: batch, "h:fn")


MANIFEST = {
    "name": "lm",
    "handler": "h:M",
    "inputs": {"prompt": {"dtype": "bytes", "shape": [1]}},
    "outputs": {"text": {"dtype": "bytes", "shape": [1]}},
}


@pytest.mark.parametrize(
    ("extra", "field", "says"),
    [
        ({"generation": {"prompt_input": "nope"}}, "generation.prompt_input", "not an input"),
        ({"generation": {"max_activ": 2}}, "generation.max_activ", "unknown key (known: ['max_a"),
        ({"generation": {"max_active": 0}}, "generation.max_active", "from 1 to 4096"),
        ({"generation": {"parameters": ["stream"]}}, "generation.parameters", "fnrt's own"),
        ({"generation": {"token_budget": 10}}, "generation.token_budget", "no room"),
        ({"generation": {}, "result_cache": {"enabled": True}}, "result_cache", "does not apply"),
        ({"generation": {}, "outputs": {}}, "generation", "needs declared"),
    ],
)
def test_the_generation_section_is_checked(extra: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_manifest({**MANIFEST, **extra})
    assert caught.value.field == field and says in caught.value.reason


def test_a_generation_section_round_trips_and_its_absence_keeps_version_ids() -> None:
    manifest = parse_manifest({**MANIFEST, "generation": {"parameters": ["seed"]}})
    assert manifest.generative and manifest.prompt_input == "prompt"
    assert parse_manifest(manifest.to_dict()) == manifest
    plain = parse_manifest(MANIFEST)
    assert not plain.generative and "generation" not in plain.to_dict()
