"""The ``tiny-lm`` example: a generative handler with continuous batching.

``start`` runs each new prompt once (prefill) and writes its keys and values
into a row of the handler's batched store; ``step`` advances every active
sequence by one character in one forward pass over their rows, each row
masked to its own length, and writes the new token's keys and values back.
A sequence that leaves (``stop``) frees its row for the next to join. Each
sequence samples from its own seeded generator, so its text does not depend
on what else shares its steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from fnrt.functions import Artifact, Chunk, Device, Generator, Sequence

from .model import (
    CONTEXT,
    HEADS,
    LAYERS,
    SPACE,
    VOCAB,
    WIDTH,
    Cache,
    TinyLM,
    encode,
    pick,
    prefill,
)


@dataclass
class State:
    """One sequence: its row of the batched cache, its last logits and its sampler."""

    slot: int  # its row in the handler's key/value store
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
        # The batched state: per layer, keys and values of every sequence, one row each
        # ([rows, heads, CONTEXT, head width]); rows are reused as sequences leave.
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.free: list[int] = []
        self._grow(16)

    def _grow(self, rows: int) -> None:
        have = self.keys[0].shape[0] if self.keys else 0
        shape = (rows - have, HEADS, CONTEXT, WIDTH // HEADS)
        self.keys = [torch.cat([k, torch.zeros(shape)]) for k in self.keys] or [
            torch.zeros(shape) for _ in range(LAYERS)
        ]
        self.values = [torch.cat([v, torch.zeros(shape)]) for v in self.values] or [
            torch.zeros(shape) for _ in range(LAYERS)
        ]
        self.free += range(rows - 1, have - 1, -1)

    def start(self, sequences: list[Sequence]) -> list[Chunk]:
        chunks = []
        with torch.inference_mode():
            for seq in sequences:
                prompt = seq.inputs["prompt"].reshape(-1)[0].decode("utf-8", "replace")
                tokens = encode(prompt)[-(CONTEXT - seq.max_new_tokens) :] or [SPACE]
                logits, cache = prefill(self.model, tokens)
                if not self.free:
                    self._grow(2 * self.keys[0].shape[0])
                slot = self.free.pop()
                for layer, (k, v) in enumerate(cache):
                    self.keys[layer][slot, :, : len(tokens)] = k[0]
                    self.values[layer][slot, :, : len(tokens)] = v[0]
                params = seq.parameters
                seq.state = State(
                    slot,
                    logits,
                    len(tokens),
                    torch.Generator().manual_seed(int(params.get("seed", 0))),
                    float(params.get("temperature", 0.0)),
                    str(params.get("stop", "")),
                )
                chunks.append(self._next(seq.state))
        return chunks

    def step(self, sequences: list[Sequence]) -> list[Chunk]:
        """One token for every sequence in one forward pass: each row attends to its own
        cached positions (and the new token, placed after the longest row)."""
        states: list[State] = [seq.state for seq in sequences]
        rows = torch.tensor([s.slot for s in states])
        lengths = torch.tensor([s.length for s in states])
        longest = int(lengths.max())
        tokens = torch.tensor([[s.last] for s in states])
        mask = torch.ones(len(states), 1, 1, longest + 1, dtype=torch.bool)
        mask[:, 0, 0, :longest] = torch.arange(longest) < lengths.view(-1, 1)
        cache: Cache = [
            (k[rows, :, :longest], v[rows, :, :longest])
            for k, v in zip(self.keys, self.values, strict=True)
        ]
        with torch.inference_mode():
            logits, new = self.model(tokens, lengths.view(-1, 1), mask, cache)
            for layer, (k, v) in enumerate(new):  # the new token's keys and values, stored
                self.keys[layer][rows, :, lengths] = k[:, :, longest]
                self.values[layer][rows, :, lengths] = v[:, :, longest]
        chunks = []
        for i, s in enumerate(states):
            s.length += 1
            s.logits = logits[i, -1]
            chunks.append(self._next(s))
        return chunks

    def stop(self, sequences: list[Sequence]) -> None:
        for seq in sequences:
            if seq.state is not None:
                self.free.append(seq.state.slot)  # its row is reused by the next to join
                seq.state = None

    def _next(self, state: State) -> Chunk:
        token = pick(state.logits, state.temperature, state.generator)
        state.last = token
        char = VOCAB[token]
        state.text += char
        done = bool(state.stop) and state.text.endswith(state.stop)
        full = state.length >= CONTEXT  # no position left for another token
        return Chunk({"token": [token], "text": [char.encode()]}, done=done or full)
