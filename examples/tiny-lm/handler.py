"""The ``tiny-lm`` example: a generative handler with continuous batching.

``start`` runs each new prompt once (prefill) and keeps its key/value cache in
``sequence.state``; ``step`` advances every active sequence by one character
in one batched forward pass: the caches, of different lengths, are padded on
the left and the padding masked out. Each sequence samples from its own seeded
generator, so its text does not depend on what else shares its steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from fnrt.functions import Artifact, Chunk, Device, Generator, Sequence

from .model import CONTEXT, SPACE, VOCAB, Cache, TinyLM, encode, pick, prefill


@dataclass
class State:
    """One sequence's cache, its last logits and its sampler."""

    cache: Cache
    logits: torch.Tensor
    length: int  # positions in the cache
    generator: torch.Generator
    temperature: float
    stop: str
    text: str = ""
    last: int = 0  # the token picked last: the next step's input


class TinyLMHandler(Generator):
    def load(self, artifacts: Mapping[str, Artifact], device: Device) -> None:
        torch.set_num_threads(1)  # one step at a time per instance: no thread contention
        self.model = artifacts["weights"].module(TinyLM, device).eval()

    def start(self, sequences: list[Sequence]) -> list[Chunk]:
        chunks = []
        with torch.inference_mode():
            for seq in sequences:
                prompt = seq.inputs["prompt"].reshape(-1)[0].decode("utf-8", "replace")
                tokens = encode(prompt)[-(CONTEXT - seq.max_new_tokens) :] or [SPACE]
                logits, cache = prefill(self.model, tokens)
                params = seq.parameters
                seq.state = State(
                    cache,
                    logits,
                    len(tokens),
                    torch.Generator().manual_seed(int(params.get("seed", 0))),
                    float(params.get("temperature", 0.0)),
                    str(params.get("stop", "")),
                )
                chunks.append(self._next(seq.state))
        return chunks

    def step(self, sequences: list[Sequence]) -> list[Chunk]:
        states: list[State] = [seq.state for seq in sequences]
        longest = max(s.length for s in states)
        tokens = torch.tensor([[s.last] for s in states])
        positions = torch.tensor([[s.length] for s in states])
        mask = torch.zeros(len(states), 1, 1, longest + 1, dtype=torch.bool)
        layers = len(states[0].cache)
        cache: Cache = []
        for layer in range(layers):
            keys, values = [], []
            for s in states:
                k, v = s.cache[layer]
                pad = longest - s.length
                keys.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
                values.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
            cache.append((torch.cat(keys), torch.cat(values)))
        for i, s in enumerate(states):
            mask[i, 0, 0, longest - s.length :] = True
        with torch.inference_mode():
            logits, new = self.model(tokens, positions, mask, cache)
        chunks = []
        for i, s in enumerate(states):
            pad = longest - s.length
            s.cache = [(k[i : i + 1, :, pad:], v[i : i + 1, :, pad:]) for k, v in new]
            s.length += 1
            s.logits = logits[i, -1]
            chunks.append(self._next(s))
        return chunks

    def stop(self, sequences: list[Sequence]) -> None:
        for seq in sequences:
            seq.state = None  # the cache goes with it

    def _next(self, state: State) -> Chunk:
        token = pick(state.logits, state.temperature, state.generator)
        state.last = token
        char = VOCAB[token]
        state.text += char
        done = bool(state.stop) and state.text.endswith(state.stop)
        full = state.length >= CONTEXT  # no position left for another token
        return Chunk({"token": [token], "text": [char.encode()]}, done=done or full)
