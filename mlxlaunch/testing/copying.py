"""A test model that copies: hand-wired weights whose greedy output walks a fixed chain of words.

Speculative decoding is worth what its drafts are accepted, and acceptance must come from a
model's own forward passes, not from a logits hook forcing a script. This model's forward pass
computes its output: the vocabulary's plain words (` return`, ` value`, …) form one chain in a
fixed shuffled order, and the model predicts, after each word of the chain, the next one, and
after anything else the chain's first word. So after any prompt its output is the chain from
the start: a prompt that holds the chain's text (a "file", with some words changed: an edit)
asks for a copy of that text, which prompt-lookup drafts predict, and a prompt without it asks
for text found nowhere in the context.

The wiring (hidden size H, RMS-normalised residual h):
- a chain word's embedding is a random vector orthogonal to dimension 0; any other token's is
  dimension 0 alone (plus a little noise);
- the output row of word `chain[i+1]` is `SCALE / sqrt(H)` times the unit embedding of
  `chain[i]`, and the first word's row adds the unit vector of dimension 0: the successor's
  logit is SCALE, any other word's at most ~0.3 SCALE (random directions), other tokens' 0;
- attention and MLP keep random weights with their residual writes scaled down, so they cost
  what a real layer costs (the KV cache is filled and read every step) without moving the
  argmax.

The chain's word ids are saved in the model directory (`copy_chain.json`) for workloads.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx.utils import tree_flatten
from tokenizers import Tokenizer

CHAIN_FILE = "copy_chain.json"
# The successor's logit; the gap to the runner-up (~0.7 of it) makes greedy decoding certain
# and sampling at temperature 1 all but certain.
SCALE = 24.0
# What the attention and MLP outputs are scaled by before they join the residual stream.
RESIDUAL_WRITE_SCALE = 0.01
NON_WORD_NOISE = 0.05


def chain_words(tokenizer: Tokenizer, seed: int) -> list[int]:
    """The chain: every learned token that is a space and 2+ ASCII letters, shuffled.

    Such tokens come back whole when their text is joined and encoded again (the byte-level
    pre-tokenizer splits before each space), so text made of them encodes to the same ids."""
    words = [
        token_id
        for text, token_id in tokenizer.get_vocab().items()
        if text.startswith("Ġ") and len(text) > 2 and text[1:].isascii() and text[1:].isalpha()
    ]
    words.sort()
    random.Random(seed).shuffle(words)
    return words


def wire_copy_weights(model: Any, chain: list[int], seed: int) -> dict[str, mx.array]:
    """The weights of a qwen3 `model` (untied embeddings) that follows `chain`."""
    parameters = cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))
    weights = dict(parameters)
    vocab, hidden = weights["model.embed_tokens.weight"].shape
    key = mx.random.key(seed)
    k_words, k_noise = mx.random.split(key)
    is_word = mx.zeros((vocab,), dtype=mx.bool_)
    is_word[mx.array(chain)] = True
    words = mx.random.normal((vocab, hidden), key=k_words)
    words[:, 0] = 0.0
    others = mx.random.normal((vocab, hidden), key=k_noise) * NON_WORD_NOISE
    others[:, 0] = math.sqrt(hidden)
    embed = mx.where(is_word[:, None], words, others)
    unit = embed / mx.linalg.norm(embed, axis=-1, keepdims=True)
    head = mx.zeros((vocab, hidden))
    successors = mx.array(chain[1:] + chain[:1])
    head[successors] = unit[mx.array(chain)]
    head[chain[0], 0] = 1.0  # after any token that is not a word: the chain's first word
    weights["model.embed_tokens.weight"] = embed
    weights["lm_head.weight"] = head * (SCALE / math.sqrt(hidden))
    for name in weights:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = weights[name] * RESIDUAL_WRITE_SCALE
    return weights


def save_chain(directory: Path, chain: list[int]) -> None:
    (directory / CHAIN_FILE).write_text(json.dumps({"chain": chain}) + "\n", encoding="utf-8")


def load_chain(directory: Path) -> list[int]:
    """The chain a copy model follows (its `copy_chain.json`)."""
    data = json.loads((directory / CHAIN_FILE).read_text(encoding="utf-8"))
    return [int(t) for t in data["chain"]]


def chain_text(tokenizer: Any, chain: list[int], words: int, *, edit_every: int = 0) -> str:
    """The text of the chain's first `words` words; with `edit_every` n, every n-th word is
    replaced by a word from far along the chain (a changed line in a file being rewritten)."""
    ids = list(chain[:words])
    if edit_every > 0:
        for i in range(edit_every - 1, len(ids), edit_every):
            ids[i] = chain[(i + len(chain) // 2) % len(chain)]
    return str(tokenizer.decode(ids))
