"""Scripted model output: make a random-weight model say exactly what a test needs.

:class:`ScriptedOutput` is an engine ``logits_hook``. Each request it is asked about takes
the next script from its queue and gets a logits processor that forces the script's tokens
one by one, then EOS. Everything after the logits — sampling, detokenizing, stop sequences,
tool-call and thinking parsers, streaming — runs unchanged.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


@dataclass(frozen=True)
class Script:
    """One scripted reply: text to encode with the request's tokenizer, or exact token ids."""

    text: str | None = None
    tokens: tuple[int, ...] | None = None

    def token_ids(self, tokenizer: Any) -> list[int]:
        """The ids to force, encoding ``text`` with ``tokenizer`` when no ids were given."""
        if self.tokens is not None:
            return list(self.tokens)
        return list(tokenizer.encode(self.text or "", add_special_tokens=False))


class ForcedTokens:
    """An mlx-lm logits processor that forces ``tokens`` in order, then ``eos_token_id``.

    The step is the growth of the token context since the first call, so the processor is
    right whether it is called once per step (``generate_step``, ``BatchGenerator``) or the
    context starts with or without the last prompt token.

    It never reads `logits`, so the sampled token does not depend on the forward pass: plain
    mlx-lm then never runs that pass and defers it to whatever next reads the KV cache. The
    engine's batch evaluates each step's caches with its samples (`engine/scheduling/
    decode.py`). It has no `rollback`: a sequence it scripts never drafts.
    """

    def __init__(self, tokens: Sequence[int], eos_token_id: int) -> None:
        self.tokens = list(tokens)
        self.eos_token_id = eos_token_id
        self._base: int | None = None

    def next_token(self, context_length: int) -> int:
        """The token to force when the context holds ``context_length`` tokens."""
        if self._base is None:
            self._base = context_length
        step = context_length - self._base
        return self.tokens[step] if step < len(self.tokens) else self.eos_token_id

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        target = self.next_token(tokens.size)
        is_target = mx.arange(logits.shape[-1]) == target
        return mx.where(is_target, mx.zeros_like(logits), mx.full(logits.shape, -mx.inf))


def eos_token_id_of(tokenizer: Any) -> int:
    """The id that ends a turn: mlx-lm's wrapper knows a set, a HF tokenizer one."""
    ids = getattr(tokenizer, "eos_token_ids", None)
    if ids:
        return min(ids)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("tokenizer has no EOS token; scripted output cannot end")
    return int(eos)


class ScriptedOutput:
    """A queue of scripted replies, used as the engine's ``logits_hook``.

    Each call (one per request) pops the next script; with an empty queue it returns ``None``
    and the model samples normally. Thread-safe: tests enqueue while the engine's worker
    thread pops.

    Example::

        scripted = ScriptedOutput()
        scripted.enqueue('<tool_call>\\n{"name": "Bash", "arguments": {}}\\n</tool_call>')
        engine = Engine(EngineConfig(model=..., logits_hook=scripted))
    """

    def __init__(self) -> None:
        self._queue: deque[Script] = deque()
        self._lock = threading.Lock()
        self.requests: list[Any] = []  # every request the hook was asked about, in order

    def enqueue(self, text: str | None = None, tokens: list[int] | None = None) -> None:
        """Queue one reply, as text or as exact token ids (not both)."""
        if (text is None) == (tokens is None):
            raise ValueError("enqueue needs exactly one of text= or tokens=")
        script = Script(text=text, tokens=tuple(tokens) if tokens is not None else None)
        with self._lock:
            self._queue.append(script)

    @property
    def pending(self) -> int:
        """How many scripts are still queued."""
        with self._lock:
            return len(self._queue)

    def __call__(self, request: Any, tokenizer: Any) -> list[LogitsProcessor] | None:
        with self._lock:
            self.requests.append(request)
            if not self._queue:
                return None
            script = self._queue.popleft()
        return [ForcedTokens(script.token_ids(tokenizer), eos_token_id_of(tokenizer))]
