"""The continuous batch: prompts prefilled in slices, sequences decoded together, with drafts.

The worker (and every follower rank of a cluster) steps one `Batch`. A sequence is inserted
with its prompt (the part its cache does not hold yet), then prefilled alongside the other
prompts in slices the worker sizes (prefill pacing), then joins the decoding rows
(`decode.DecodeBatch`) for the rest of its life: one forward pass per step for all of them,
with drafted tokens verified in the same pass where speculative decoding is on.

A step returns what it did: each prompt's progress, and each sequence's new tokens. A
sequence's first token comes in the step that finishes its prompt; after that, tokens come one
step after their forward pass was issued, because the pass is left computing while the worker
handles the tokens of the one before (see `DecodeBatch.issue` / `resolve`).

Prompt processing is mlx-lm's (`PromptProcessingBatch`: right-padded chunks, every cache type
mlx-lm batches); decoding is this project's, to verify drafts and roll back per sequence.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.generate import PromptProcessingBatch, generation_stream
from mlx_lm.models.cache import BatchKVCache, KVCache

from mlxlaunch.engine.decoding.draft_model import DraftModel
from mlxlaunch.engine.decoding.drafting import DraftWidth, PromptLookup
from mlxlaunch.engine.runtime.quantized_kv import QuantizedRowKVCache
from mlxlaunch.engine.runtime.vision import VisionLanguageModel, set_row_shifts
from mlxlaunch.engine.scheduling.decode import (
    DecodeBatch,
    Emitted,
    Processor,
    Row,
    Sampler,
    can_roll_back,
    greedy,
)

# Decode steps between two releases of MLX's buffer cache (as mlx-lm's generator does).
CLEAR_CACHE_STEPS = 512

# Prompts prefilled together are padded to the longest chunk and the longest cache, so a short
# prompt beside a long one costs as much as the long one, and rows of different shapes take
# the masked attention path: a 418-token main-loop slice beside a 23-token title took 2.2 s on
# the CPU, 0.27 s alone. A prompt joins the prompts being prefilled only where the padding
# adds at most a quarter to their work (PAD_LIMIT); else it waits until they are done. Work
# is counted in KV positions: a token's attention reads every position before it, and its
# other layers cost about as much as reading this many more.
PAD_LIMIT = 1.25
TOKEN_WORK_POSITIONS = 4096

Held = tuple[list[Any], list[int]]  # a sequence's per-layer caches and the tokens they hold


def make_batch(
    loaded: Any, config: Any, sampler: Sampler | None = None, speculation: Any = None
) -> Batch:
    """The batch of the worker, and of every follower rank of a cluster: one shape for all
    (the same width and chunk mean the same forward passes, so the same collectives, on every
    rank). `loaded`: the LoadedModel; `config`: the EngineConfig; `sampler`: the shared one
    (None: greedy); `speculation`: how sequences draft (scheduling/speculation.py; None:
    they do not)."""
    return Batch(
        loaded.model,
        stop_tokens=list(loaded.info.eos_token_ids),
        width=config.max_concurrency,
        prefill_chunk=config.prefill_chunk,
        sampler=sampler,
        speculate=speculation is not None and speculation.on,
        draft_model=speculation.draft if speculation is not None else None,
        vision=loaded.vision,
    )


@dataclass
class Progress:
    """One prompt's processing in a step."""

    uid: int
    done: int  # tokens of the inserted prompt whose KV is now held
    total: int  # tokens of the inserted prompt
    ended: bool = False  # the prompt is done: its first token is among this step's tokens
    snapshot: Held | None = None  # at all-but-the-last token, when the insert asked for it


@dataclass
class Counters:
    """What the batch has done since it was made (read by the worker's stats windows)."""

    prompt_tokens: int = 0
    prompt_time: float = 0.0
    generation_tokens: int = 0
    decode_time: float = 0.0
    decode_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0


@dataclass
class _Sequence:
    """A sequence until it decodes: what it was inserted with, and its prompt's progress."""

    uid: int
    prompt: list[int]
    max_tokens: int
    cache: list[Any]
    held: list[int]
    sampler: Sampler | None
    processors: list[Processor]
    drafter: PromptLookup | None
    snapshot: bool
    may_draft: bool
    urgent: bool = False  # the main loop's: admitted first, and beside any other prompts
    done: int = 0  # prompt tokens prefilled
    shift: int = 0  # the rotary shift of the images in its held tokens (runtime/vision.py)

    def slice_shape(self, chunk: int) -> tuple[int, int]:
        """(tokens of its next slice, tokens its cache holds before them)."""
        return min(len(self.prompt) - 1 - self.done, chunk), len(self.held) + self.done


@dataclass
class Batch:
    """Every sequence being generated, stepped by one thread (the MLX thread).

    Args:
        model: the mlx-lm model.
        stop_tokens: tokens that end a sequence (its end-of-turn tokens).
        width: most sequences at once (prefilling and decoding together).
        prefill_chunk: most prompt tokens of one prompt per forward pass.
        sampler: the sampler of sequences inserted without one (default: greedy).
        speculate: draft tokens where sequences can (speculative decoding): from the prompt
            lookup drafter each brings, or from `draft_model`.
        draft_model: drafts for every sequence from a small model (decoding/draft_model.py).
        vision: the vision model behind `model`, told each row's rotary shift before a pass
            (runtime/vision.py; None: a text model).
    """

    model: Any
    stop_tokens: Sequence[int]
    width: int
    prefill_chunk: int
    sampler: Sampler | None = None
    speculate: bool = False
    draft_model: DraftModel | None = None
    vision: VisionLanguageModel | None = None
    counters: Counters = field(default_factory=Counters)
    _clock: Callable[[], float] = time.perf_counter

    def __post_init__(self) -> None:
        self._waiting: deque[_Sequence] = deque()
        self._prefill: PromptProcessingBatch | None = None
        self._prefilling: list[_Sequence] = []
        self.decode = DecodeBatch(
            self.model,
            self.sampler or greedy,
            set(self.stop_tokens),
            DraftWidth() if self.speculate else None,
            self._clock,
            self.draft_model,
            self.vision,
        )
        self._early: list[Emitted] = []  # resolved before a removal, reported next step
        self._joining: list[list[Any]] = []  # batch caches of the prompts ready to decode
        self._next_uid = 0

    # --- membership -----------------------------------------------------------------------

    def insert(
        self,
        prompt: list[int],
        *,
        max_tokens: int,
        cache: list[Any],
        held: list[int],
        sampler: Sampler | None = None,
        processors: Sequence[Processor] = (),
        drafter: PromptLookup | None = None,
        snapshot: bool = False,
        urgent: bool = False,
    ) -> int:
        """Queue a sequence; its uid. `prompt`: the tokens `cache` does not hold yet (at least
        one); `held`: those it holds; `drafter`: its draft source (speculative decoding);
        `snapshot`: report its caches when all but the prompt's last token are in; `urgent`:
        the main loop's prompt, admitted before the others (every rank of a cluster must pass
        the same)."""
        if not prompt:
            raise ValueError("a sequence needs at least one prompt token")
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        uid = self._next_uid
        self._next_uid += 1
        processors = list(processors)
        may_draft = self.speculate and can_roll_back(processors)
        sequence = _Sequence(
            uid=uid,
            prompt=list(prompt),
            max_tokens=max_tokens,
            cache=cache,
            held=list(held),
            sampler=sampler,
            processors=processors,
            drafter=drafter if may_draft else None,
            snapshot=snapshot,
            may_draft=may_draft,
            urgent=urgent,
            shift=self.vision.table.shift_of(held) if self.vision is not None else 0,
        )
        self._waiting.append(sequence)
        return uid

    def remove(self, uids: Sequence[int]) -> dict[int, Held]:
        """Take sequences out; what each one's caches hold, by uid (where they hold any)."""
        wanted = set(uids)
        out: dict[int, Held] = {}
        with mx.stream(generation_stream):
            for seq in [s for s in self._waiting if s.uid in wanted]:
                self._waiting.remove(seq)
                out[seq.uid] = (seq.cache, seq.held)
            if self._prefill is not None:
                gone = [i for i, s in enumerate(self._prefilling) if s.uid in wanted]
                if gone:
                    taken = self._take_prefilling(gone)
                    out.update({s.uid: h for s, h in taken})
            decode = self.decode
            gone = [i for i, row in enumerate(decode.rows) if row.uid in wanted]
            if gone:
                early = decode.resolve_now()
                self._early += [e for e in early if e.uid not in wanted]
                for i in gone:
                    out[decode.rows[i].uid] = (decode.extract(i), list(decode.rows[i].tokens))
                decode.leave([i for i in range(len(decode.rows)) if i not in gone])
        return out

    def __len__(self) -> int:
        return len(self._waiting) + len(self._prefilling) + len(self.decode)

    def kv_bytes(self) -> int:
        """Bytes the sequences' KV caches hold now: waiting (their reused prefixes),
        prefilling and decoding (buffers with their spare room, as allocated)."""
        caches = [c for s in self._waiting for c in s.cache]
        caches += self.decode.caches + [c for part in self._joining for c in part]
        if self._prefill is not None:
            caches += self._prefill.prompt_cache
        return int(sum(getattr(c, "nbytes", 0) for c in caches))

    # --- one step -------------------------------------------------------------------------

    def step(self, prefill_tokens: int) -> tuple[list[Progress], list[Emitted]]:
        """Prefill at most `prefill_tokens` tokens of each prompt (0: decode only) and advance
        every decoding sequence; each prompt's progress and each sequence's new tokens."""
        with mx.stream(generation_stream):
            start = self._clock()
            decode = self.decode
            emitted = self._early + decode.resolve_now()
            self._early = []
            self._retire(emitted)
            self._count_decode(emitted, start)
            self._admit(prefill_tokens)
            ready = self._ready()  # prompts inserted with their last token alone
            progress = self._prefill_slice(prefill_tokens)
            ready += self._ready()
            if ready:
                progress += self._join(ready)
            if len(decode):
                decode.issue(timed=not progress)
            if ready:  # their first tokens now, not a step later; then the next pass computes
                tic = self._clock()
                now = decode.resolve()
                self._retire(now)
                self._count_decode(now, tic)
                emitted += now
                if len(decode):
                    decode.issue(timed=False)
            self.counters.decode_steps += 1
            if self.counters.decode_steps % CLEAR_CACHE_STEPS == 0:
                mx.clear_cache()
        return progress, emitted

    def _count_decode(self, emitted: list[Emitted], since: float) -> None:
        counters = self.counters
        counters.generation_tokens += sum(len(e.tokens) for e in emitted)
        counters.drafted_tokens += sum(e.drafted for e in emitted)
        counters.accepted_tokens += sum(e.accepted for e in emitted)
        if emitted:
            counters.decode_time += self._clock() - since

    def _retire(self, emitted: list[Emitted]) -> None:
        """Take finished sequences out of the decoding rows, their caches on their Emitted."""
        decode = self.decode
        finished = {e.uid: e for e in emitted if e.finish_reason is not None}
        if not finished:
            return
        keep: list[int] = []
        for i, row in enumerate(decode.rows):
            event = finished.get(row.uid)
            if event is None:
                keep.append(i)
            else:
                event.held = (decode.extract(i), list(row.tokens))
        decode.leave(keep)

    # --- prompts --------------------------------------------------------------------------

    def _admit(self, slice_tokens: int) -> None:
        """Waiting sequences join the prompts being prefilled, while there is room: urgent
        ones first, each only where the padding is cheap (`_pads_cheaply`). An urgent prompt
        that is not waits only where the others finish within this slice; the others wait,
        in order, so none is passed for ever by later, shorter ones."""
        room = self.width - len(self._prefilling) - len(self.decode)
        group = list(self._prefilling)
        new: list[_Sequence] = []
        for seq in sorted(self._waiting, key=lambda s: not s.urgent):  # stable: in order
            if room <= 0:
                break
            if not self._pads_cheaply(group, seq):
                if not seq.urgent:
                    break
                if all(len(s.prompt) - 1 - s.done <= slice_tokens for s in group):
                    continue  # they are done this step: it starts next step, alone
            group.append(seq)
            new.append(seq)
            room -= 1
        if not new:
            return
        chosen = {id(s) for s in new}
        self._waiting = deque(s for s in self._waiting if id(s) not in chosen)
        batch = PromptProcessingBatch(
            self.model,
            [s.uid for s in new],
            [s.cache for s in new],
            tokens=[list(s.held) for s in new],
            prefill_step_size=self.prefill_chunk,
            # Kept per row by mlx-lm's batch (its filter and extend need them); not used here.
            samplers=[greedy] * len(new),
            logits_processors=[[] for _ in new],
            max_tokens=[s.max_tokens for s in new],
        )
        if self._prefill is None:
            self._prefill = batch
        else:
            self._prefill.extend(batch)
        self._prefilling += new

    def _pads_cheaply(self, group: list[_Sequence], seq: _Sequence) -> bool:
        """Whether `seq` prefilled beside `group` adds at most PAD_LIMIT to their work."""
        if not group:
            return True
        shapes = [s.slice_shape(self.prefill_chunk) for s in [*group, seq]]
        own = sum(n * (TOKEN_WORK_POSITIONS + held + n) for n, held in shapes)
        longest = max(n for n, _ in shapes)
        deepest = max(held for _, held in shapes)
        padded = len(shapes) * longest * (TOKEN_WORK_POSITIONS + deepest + longest)
        return padded <= PAD_LIMIT * own

    def _prefill_slice(self, tokens: int) -> list[Progress]:
        """One slice of every prompt that has more than its last token left."""
        batch = self._prefill
        if batch is None or tokens <= 0:
            return []
        pending = self._prefilling  # each has more than its last token left (see _ready)
        chunks = [s.prompt[s.done : min(s.done + tokens, len(s.prompt) - 1)] for s in pending]
        tic = self._clock()
        if self.vision is not None:
            set_row_shifts(self.vision, [s.shift for s in pending], prefill=True)
        batch.prompt(chunks)
        self.counters.prompt_time += self._clock() - tic
        self.counters.prompt_tokens += sum(len(c) for c in chunks)
        progress: list[Progress] = []
        for i, (seq, chunk) in enumerate(zip(pending, chunks, strict=True)):
            seq.done += len(chunk)
            if self.vision is not None:
                seq.shift += self.vision.table.shift_of(chunk)
            event = Progress(seq.uid, seq.done, len(seq.prompt))
            if seq.snapshot and seq.done == len(seq.prompt) - 1:
                event.snapshot = (batch.extract_cache(i), list(batch.tokens[i]))
            progress.append(event)
        return progress

    def _ready(self) -> list[_Sequence]:
        """Take out the prompts that have only their last token left, with their caches."""
        indices = [i for i, s in enumerate(self._prefilling) if s.done >= len(s.prompt) - 1]
        if not indices:
            return []
        batch = self._prefill
        assert batch is not None
        seqs = [self._prefilling[i] for i in indices]
        rest = [i for i in range(len(self._prefilling)) if i not in set(indices)]
        for seq, i in zip(seqs, indices, strict=True):
            seq.held = list(batch.tokens[i])  # now: every prompt token but the last
        caches = batch.prompt_cache if not rest else _split_rows(batch.prompt_cache, indices)
        self._keep_prefilling(rest)
        for seq in seqs:
            seq.cache = []
        self._joining.append(caches)
        return seqs

    def _join(self, seqs: list[_Sequence]) -> list[Progress]:
        """Ready prompts start decoding: their last token is their first input."""
        rows: list[Row] = []
        for seq in seqs:
            drafter = seq.drafter
            if drafter is not None and not drafter.tokens:
                drafter.extend([*seq.held, seq.prompt[-1]])
            rows.append(
                Row(
                    uid=seq.uid,
                    tokens=seq.held,
                    pending=seq.prompt[-1],
                    max_tokens=seq.max_tokens,
                    sampler=seq.sampler,
                    processors=seq.processors,
                    may_draft=seq.may_draft,
                    drafter=drafter,
                    shift=seq.shift,
                )
            )
        parts, self._joining = self._joining, []
        caches = parts[0]
        for more in parts[1:]:
            for mine, theirs in zip(caches, more, strict=True):
                mine.extend(theirs)
        self.decode.join(rows, caches)
        return [Progress(s.uid, len(s.prompt), len(s.prompt), ended=True) for s in seqs]

    def _take_prefilling(self, indices: list[int]) -> list[tuple[_Sequence, Held]]:
        """Take prompts out of the prefill batch, each with its own caches and tokens."""
        batch = self._prefill
        assert batch is not None
        taken = [
            (self._prefilling[i], (batch.extract_cache(i), list(batch.tokens[i]))) for i in indices
        ]
        self._keep_prefilling([i for i in range(len(self._prefilling)) if i not in set(indices)])
        return taken

    def _keep_prefilling(self, rest: list[int]) -> None:
        if rest:
            assert self._prefill is not None
            if len(rest) < len(self._prefilling):
                self._prefill.filter(rest)
            self._prefilling = [self._prefilling[i] for i in rest]
        else:
            self._prefill = None
            self._prefilling = []

    def close(self) -> None:
        """Drop every sequence (nothing is reported)."""
        self._waiting.clear()
        self._prefill = None
        self._prefilling = []
        self.decode.resolve_now()
        self.decode.leave([])


def _split_rows(caches: list[Any], indices: list[int]) -> list[Any]:
    """Batch caches of just the rows `indices` of `caches` (which keep all their rows)."""
    out = []
    for cache in caches:
        if type(cache) is BatchKVCache:  # copy those rows only
            rows: list[KVCache] = [cache.extract(i) for i in indices]
            out.append(BatchKVCache.merge(rows))
        elif type(cache) is QuantizedRowKVCache:
            out.append(QuantizedRowKVCache.of_sequences([cache.extract(i) for i in indices]))
        else:  # any other cache type: a copy of the whole batch, cut to the rows
            mine = copy.deepcopy(cache)
            mine.filter(indices)
            out.append(mine)
    return out
