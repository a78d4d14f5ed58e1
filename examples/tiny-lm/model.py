"""The network of the ``tiny-lm`` example: a small decoder-only transformer over
characters, with a key/value cache so each new token costs one position.

Tokens are the printable ASCII characters and the newline (96 of them); any
other character of a prompt reads as a space. ``generate`` is the reference:
the model run by itself, one sequence, the way the handler runs it in a batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))
SPACE = VOCAB.index(" ")
CONTEXT = 128  # positions: prompt and generated tokens together
WIDTH = 96
HEADS = 4
LAYERS = 2

#: One layer's cache: keys and values, each [batch, heads, positions, head width].
Cache = list[tuple[torch.Tensor, torch.Tensor]]


def encode(text: str) -> list[int]:
    return [VOCAB.find(c) if c in VOCAB else SPACE for c in text]


def decode(tokens: list[int]) -> str:
    return "".join(VOCAB[t] for t in tokens)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)
        self.norm2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(
        self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None, mask: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(WIDTH, dim=-1)
        q, k, v = (t.view(b, s, HEADS, WIDTH // HEADS).transpose(1, 2) for t in (q, k, v))
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.out(attended.transpose(1, 2).reshape(b, s, WIDTH))
        return x + self.mlp(self.norm2(x)), (k, v)


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(VOCAB), WIDTH)
        self.position = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, len(VOCAB))

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: Cache | None = None,
    ) -> tuple[torch.Tensor, Cache]:
        """Logits for ``tokens`` [batch, s] at ``positions`` [batch, s]; ``mask`` [batch,
        1, s, cached + s] says which positions each may attend to (True: attend)."""
        x = self.embed(tokens) + self.position(positions)
        new: Cache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, cache[i] if cache is not None else None, mask)
            new.append(kv)
        return self.head(self.norm(x)), new


def causal_mask(s: int) -> torch.Tensor:
    return torch.ones(s, s, dtype=torch.bool).tril().view(1, 1, s, s)


def prefill(model: TinyLM, tokens: list[int]) -> tuple[torch.Tensor, Cache]:
    """One prompt's last logits and its cache (batch of one)."""
    s = len(tokens)
    x = torch.tensor([tokens])
    logits, cache = model(x, torch.arange(s).view(1, s), causal_mask(s))
    return logits[0, -1], cache


def pick(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> int:
    """The next token: the most likely at temperature 0, else sampled."""
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def generate(
    model: TinyLM, prompt: str, max_new_tokens: int, temperature: float = 0.0, seed: int = 0
) -> str:
    """The model by itself: ``max_new_tokens`` characters after ``prompt``."""
    generator = torch.Generator().manual_seed(seed)
    tokens = encode(prompt)[-(CONTEXT - max_new_tokens) :] or [SPACE]
    out = []
    with torch.inference_mode():
        logits, cache = prefill(model, tokens)
        length = len(tokens)
        for _ in range(max_new_tokens):
            token = pick(logits, temperature, generator)
            out.append(token)
            if len(out) == max_new_tokens:
                break
            mask = torch.ones(1, 1, 1, length + 1, dtype=torch.bool)
            step, cache = model(torch.tensor([[token]]), torch.tensor([[length]]), mask, cache)
            logits = step[0, -1]
            length += 1
    return decode(out)


def build() -> TinyLM:
    return TinyLM()


def parameters_count(model: nn.Module) -> int:
    return sum(math.prod(p.shape) for p in model.parameters())
