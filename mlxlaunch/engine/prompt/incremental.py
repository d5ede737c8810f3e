"""Incremental tokenization: reuse the token ids of a recently tokenized prompt's prefix.

Every Claude Code turn resends the whole conversation (~50k characters on the first turn alone),
so tokenizing each rendered prompt from scratch costs tens of milliseconds per request, while
all but its end was tokenized a moment ago. This module remembers a few recent (text → token
ids) pairs and, for a text that starts like a remembered one, reuses the remembered ids up to
a *boundary* and tokenizes only the rest.

Why a boundary is safe. A Hugging Face fast tokenizer first cuts the text at its added tokens
(leftmost-longest matching on the raw text for tokens with `normalized=False`), then
normalizes, pre-tokenizes and BPE-encodes every piece on its own: no merge crosses an added
token. So when a prefix P ends with an added token T, tokenize(P + R) is tokenize(P) followed
by tokenize(T + R) without its first token, provided that

- no added token contains T's text followed by more characters (such a token could match
  across the end of P; with leftmost-longest matching nothing else can),
- T's id comes only from matching T (the model's own vocabulary does not hold it),
- T is matched on the raw text (`normalized=False`), takes no neighbouring whitespace
  (`lstrip`/`rstrip` off) and does not depend on the character after it (`single_word` off),
- and the tokenizer does not split special tokens (`encode_special_tokens` off).

Tokenizing T + R rather than R keeps anything that depends on a piece's position in the text
(e.g. a Metaspace pre-tokenizer prepending only to the very first piece) as it is in the full
text. Boundary positions come from the tokenizer's own offsets, never from searching the text.

Line starts. Special tokens can be far apart: a new session's first user message (instructions,
environment, CLAUDE.md) is ~2.5k tokens without one, and re-tokenizing it costs ~4 ms, mostly
in the pre-tokenizer's regular expression. For byte-level BPE tokenizers (GPT-2, Llama 3,
Qwen, DeepSeek) a line start — a position after "\n" whose character is not whitespace — is
also a split point: their pre-tokenizer expressions end every piece containing a newline at
its last newline, and never start a piece with a newline followed by more. A remembered text
then also keeps the end offset of each token, and a new text that diverges well after a line
start where the old tokens split reuses them up to there. That this holds is checked on a probe
text when the tokenizer is first seen, for every line start in it; a tokenizer that fails, or
has a normalizer or a pre-tokenizer not of that kind, uses special tokens only.

Anything else — a tokenizer that is not a plain `tokenizers` backend, one with truncation or
padding configured, a slow tokenizer — is tokenized in full every time, exactly as before.

Not thread-safe: the caller holds the tokenizer lock around every call.
"""

from __future__ import annotations

import json
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mlxlaunch.engine.runtime.mlx_lm_internals import tokenizers_backend_of

DEFAULT_CAPACITY = 8
# Characters between a line-start split and the first character that differs: the pre-tokenizer
# looks at most a character past a piece's end; the rest is a safety margin.
LINE_SPLIT_MARGIN = 16
# A line-start split is used only when it reuses at least this many more tokens than the last
# special token would (below that, re-tokenizing costs too little to matter).
MIN_LINE_GAIN = 32
# Text on which line starts are verified as split points: code, prose, markup, unicode,
# whitespace runs, CRLF, punctuation before newlines.
_LINE_PROBE = (
    "def main(argv):\n    return run(argv)  # ok\n\n\nclass A:\n\tpass\n"
    "Hello, world!\nLine two.\r\nThird: é ü 漢字 🙂\n  indented\n- item\n* star\n"
    "<tag attr='x'>\n</tag>\n```python\nx = 1\n```\n12345 67\n'quoted'\n...\nend"
)
# A probe for the backend check: chat markup, code, unicode, and whitespace runs.
_PROBE = "Hello  world!\n\n\tdef f(x):  return x ** 2  # é ü 漢字 🙂\r\n   end"


@dataclass
class _Entry:
    """A remembered text, its token ids, and its boundaries: `marks[i]` characters of the text
    are exactly `ends[i]` tokens, and the text at `marks[i]` ends with a boundary token.
    `offsets[j]`: where token j ends in the text (kept only where line starts are splits)."""

    text: str
    ids: array[int]
    marks: list[int]
    ends: list[int]
    offsets: array[int] | None = None


@dataclass
class TokenizeStats:
    """How the incremental tokenizer did (for tests and benchmarks)."""

    exact_hits: int = 0
    partial_hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    primed: int = 0
    line_hits: int = 0  # partial hits split at a line start rather than a special token


def boundary_tokens(backend: Any) -> dict[int, str]:
    """Added tokens after which a text can be split without changing its tokenization
    (see the module docstring for the conditions): id → text."""
    added = backend.get_added_tokens_decoder()
    contents = [token.content for token in added.values()]
    safe: dict[int, str] = {}
    for token_id, token in added.items():
        text = token.content
        if not text or token.normalized or token.lstrip or token.rstrip or token.single_word:
            continue
        # An id the model itself can produce (an unknown-token id, say) is not always a split.
        if backend.model.id_to_token(token_id) is not None:
            continue
        # Another added token with T's text followed by more could match across the split.
        if any(_continues(other, text) for other in contents):
            continue
        # It must tokenize on its own as itself, or the offsets would not mean what we think.
        if backend.encode(text, add_special_tokens=False).ids != [token_id]:
            continue
        safe[token_id] = text
    return safe


def line_starts_split(backend: Any) -> bool:
    """Whether a line start is a split point for `backend` (see the module docstring): a
    byte-level BPE with no normalizer, and exact on every line start of a probe text."""
    try:
        description = json.loads(backend.to_str())
    except Exception:
        return False
    if description.get("normalizer") is not None or not _byte_level(
        description.get("pre_tokenizer")
    ):
        return False
    full = backend.encode(_LINE_PROBE, add_special_tokens=False)
    ends = [end for _, end in full.offsets]
    for start in line_starts(_LINE_PROBE, 0, len(_LINE_PROBE)):
        kept = bisect_right(ends, start)
        if kept == 0 or ends[kept - 1] != start:
            return False
        tail = backend.encode(_LINE_PROBE[start:], add_special_tokens=False).ids
        if full.ids[:kept] + tail != full.ids:
            return False
    return True


def _byte_level(pre_tokenizer: Any) -> bool:
    """A ByteLevel pre-tokenizer without a prefix space, alone or after regex splits."""
    if not isinstance(pre_tokenizer, dict):
        return False
    kind = pre_tokenizer.get("type")
    if kind == "ByteLevel":
        return pre_tokenizer.get("add_prefix_space") is False
    if kind == "Sequence":
        steps = pre_tokenizer.get("pretokenizers") or []
        return (
            bool(steps)
            and all(step.get("type") in ("Split", "ByteLevel", "Digits") for step in steps)
            and all(_byte_level(step) for step in steps if step.get("type") == "ByteLevel")
            and any(step.get("type") == "ByteLevel" for step in steps)
        )
    return False


def line_starts(text: str, low: int, high: int) -> list[int]:
    """Positions in [low, high) that follow a "\n" and hold a non-whitespace character."""
    found = []
    at = text.find("\n", max(0, low - 1), high)
    while at >= 0:
        start = at + 1
        if low <= start < high and start < len(text) and not text[start].isspace():
            found.append(start)
        at = text.find("\n", start, high)
    return found


def last_line_start(text: str, low: int, high: int) -> int:
    """The last line start in [low, high), or -1."""
    at = text.rfind("\n", max(0, low - 1), max(0, high - 1))
    while at >= 0:
        start = at + 1
        if start >= low and start < len(text) and not text[start].isspace():
            return start
        if start <= low:
            return -1
        at = text.rfind("\n", max(0, low - 1), at)
    return -1


def _continues(other: str, text: str) -> bool:
    """Whether `other` contains `text` somewhere other than at its very end."""
    at = other.find(text)
    while at >= 0:
        if at + len(text) < len(other):
            return True
        at = other.find(text, at + 1)
    return False


class IncrementalTokenizer:
    """`encode(text)` equal to the tokenizer's own `encode(text, add_special_tokens=False)`,
    reusing the ids of up to `capacity` recently encoded texts (least recently used dropped)."""

    def __init__(
        self,
        hf_tokenizer: Any,
        capacity: int = DEFAULT_CAPACITY,
        min_line_gain: int = MIN_LINE_GAIN,
    ) -> None:
        self._fallback: Callable[[str], Sequence[int]] = lambda text: hf_tokenizer.encode(
            text, add_special_tokens=False
        )
        self.capacity = capacity
        self.min_line_gain = min_line_gain
        self.stats = TokenizeStats()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next_key = 0
        backend = tokenizers_backend_of(hf_tokenizer)
        # The backend is used only if it agrees with the tokenizer's own encode on a probe.
        if backend is not None and backend.encode(_PROBE, add_special_tokens=False).ids != list(
            self._fallback(_PROBE)
        ):
            backend = None
        self._backend = backend
        self.boundaries = boundary_tokens(backend) if backend is not None else {}
        self.line_splits = (
            backend is not None and bool(self.boundaries) and line_starts_split(backend)
        )
        # Added tokens are matched on the raw text before anything else: one that starts
        # before a split and ends past the first differing character would change the
        # tokens before the split, so the margin covers the longest of them.
        added = backend.get_added_tokens_decoder().values() if backend is not None else []
        self._line_margin = max([LINE_SPLIT_MARGIN, *(len(t.content) + 1 for t in added)])

    @property
    def incremental(self) -> bool:
        """Whether texts are tokenized incrementally (else always in full)."""
        return bool(self.boundaries) and self.capacity > 0

    def encode(self, text: str) -> list[int]:
        """The token ids of `text` (no special tokens added)."""
        if not self.incremental:
            if self._backend is not None:
                return list(encode_released(self._backend, text).ids)
            return list(self._fallback(text))
        for key, seen in self._entries.items():
            if len(seen.text) == len(text) and seen.text == text:
                self._entries.move_to_end(key)
                self.stats.exact_hits += 1
                return seen.ids.tolist()
        entry, mark, shared = self._best_prefix(text)
        # An adopted reply (`adopt`) has no offsets: it splits at its boundaries only.
        if entry is not None and self.line_splits and entry.offsets is not None:
            ids = self._continue_at_line(entry, mark, shared, text)
            if ids is not None:
                return ids
        if entry is not None and mark >= 0:
            ids = self._continue(entry, mark, text)
            if ids is not None:
                return ids
        self.stats.misses += 1
        ids, full = self._tokenize(text)
        if full is not None:
            self._remember(full)
        return ids

    def prime(self, token_sequences: Iterable[Sequence[int]]) -> int:
        """Remember texts whose token ids are known (e.g. prefixes restored from the disk
        cache after a restart), so the first request that continues one is incremental.

        A restored prefix usually ends inside a message (where sessions diverge). Each is
        decoded and kept up to its last line start (where line starts are split points) or
        else its last boundary token, and only if tokenizing that text gives exactly those
        ids back. Returns how many were kept.
        """
        if not self.incremental or self._backend is None:
            return 0
        kept = 0
        for sequence in token_sequences:
            entry = self._line_entry(list(sequence)) if self.line_splits else None
            entry = entry or self._boundary_entry(list(sequence))
            if entry is not None:
                self._remember(entry)
                kept += 1
        self.stats.primed += kept
        return kept

    def _line_entry(self, ids: list[int]) -> _Entry | None:
        """The decoded `ids` up to their last line start, if they round-trip exactly."""
        assert self._backend is not None
        text = self._backend.decode(ids, skip_special_tokens=False)
        encoded, full = self._tokenize(text)
        if full is None or full.offsets is None:
            return None
        start = last_line_start(text, 1, len(text) - self._line_margin)
        if start < 0:
            return None
        count = bisect_right(full.offsets, start)
        if count == 0 or full.offsets[count - 1] != start or encoded[:count] != ids[:count]:
            return None
        marks = [m for m in full.marks if m <= start]
        return _Entry(
            text[:start], full.ids[:count], marks, full.ends[: len(marks)], full.offsets[:count]
        )

    def _boundary_entry(self, ids: list[int]) -> _Entry | None:
        """The decoded `ids` up to their last boundary token, if they round-trip exactly."""
        assert self._backend is not None
        cut = max((j for j, t in enumerate(ids) if t in self.boundaries), default=-1)
        if cut < 0:
            return None
        ids = ids[: cut + 1]
        text = self._backend.decode(ids, skip_special_tokens=False)
        encoded, entry = self._tokenize(text)
        return entry if entry is not None and encoded == ids else None

    def count(self, text: str) -> int:
        """How many tokens `encode(text)` gives, remembering nothing (for pieces of a prompt
        that may be refused: see prompt_size)."""
        if self._backend is None:
            return len(self._fallback(text))
        # No offsets or ids kept on the Python side, and the Rust code runs without the GIL.
        batch = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
        return len(batch([text], add_special_tokens=False)[0])

    def forget_text(self, text: str) -> None:
        """Forget `text` if it is remembered (a prompt that was refused: no later one
        continues it, and it may be large)."""
        for key, old in list(self._entries.items()):
            if old.text is text or old.text == text:
                del self._entries[key]

    def adopt(self, token_ids: Sequence[int]) -> bool:
        """Remember a finished request's prompt and reply as the model wrote them, so the
        next turn, whose prompt renders that reply back, reuses these exact ids.

        The one exception to `encode` matching the tokenizer: a reply's text tokenized anew
        is often split differently from how the model produced it (a generation prompt's
        trailing "\n\n" becomes "\n" "\n" once text follows it, say), and from the first
        differing id on, the prefix cache could reuse nothing: every turn would prefill the
        previous reply again. Kept up to the last boundary token (the reply's end-of-turn
        token, typically); a later text reuses them only where it has the same characters,
        so a template that re-renders the reply differently just reuses less. Returns
        whether the ids were kept."""
        if not self.incremental or self._backend is None:
            return False
        ids = list(token_ids)
        cut = max((j for j, t in enumerate(ids) if t in self.boundaries), default=-1)
        if cut < 0:
            return False
        ids = ids[: cut + 1]
        pieces: list[str] = []
        marks: list[int] = []
        ends: list[int] = []
        start = length = 0
        for index in range(cut + 1):
            if ids[index] in self.boundaries:
                piece = self._backend.decode(ids[start : index + 1], skip_special_tokens=False)
                if not piece.endswith(self.boundaries[ids[index]]):
                    return False
                pieces.append(piece)
                length += len(piece)
                marks.append(length)
                ends.append(index + 1)
                start = index + 1
        text = "".join(pieces)
        # Decoding piecewise must agree with decoding the whole (a decoder that strips a
        # piece's leading space would shift every later mark).
        if text != self._backend.decode(ids, skip_special_tokens=False):
            return False
        self._remember(_Entry(text, array("i", ids), marks, ends, None))
        return True

    def clear(self) -> None:
        """Forget every remembered text."""
        self._entries.clear()

    # --- internals ------------------------------------------------------------------------

    def _best_prefix(self, text: str) -> tuple[_Entry | None, int, int]:
        """The remembered entry sharing the most text with `text` (and so the most reusable
        tokens), the index of the last boundary inside that shared text in its marks (-1:
        none), and how many characters they share."""
        best: _Entry | None = None
        best_mark, best_shared = -1, 0
        for entry in self._entries.values():
            shared = common_prefix_length(entry.text, text)
            if shared > best_shared:
                best, best_shared = entry, shared
                best_mark = bisect_right(entry.marks, shared) - 1  # the last boundary inside
        return best, best_mark, best_shared

    def _continue(self, entry: _Entry, mark: int, text: str) -> list[int] | None:
        """`text`'s ids: the entry's ids up to boundary `mark`, then the rest tokenized from the
        boundary token on. None if the tail does not start with that token (never expected)."""
        assert self._backend is not None
        split, kept = entry.marks[mark], entry.ends[mark]
        token_id = entry.ids[kept - 1]
        token_text = self.boundaries[token_id]
        start = split - len(token_text)
        tail = encode_released(self._backend, text[start:])
        tail_ids = tail.ids
        if not tail_ids or tail_ids[0] != token_id:
            return None
        # The new text holds every boundary of the old one: the old one would only ever save
        # tokenizing its few characters after its last boundary. One conversation thus keeps
        # one entry, however many turns it has.
        return self._splice(
            entry, mark, text, tail, start, kept, skip=1, covers=mark == len(entry.marks) - 1
        )

    def _continue_at_line(
        self, entry: _Entry, mark: int, shared: int, text: str
    ) -> list[int] | None:
        """`text`'s ids split at the last line start well inside the shared text, where the
        old tokens split too; None where that would not reuse clearly more than `mark`."""
        assert self._backend is not None
        offsets = entry.offsets
        if offsets is None:
            return None
        special_kept = entry.ends[mark] if mark >= 0 else 0
        special_split = entry.marks[mark] if mark >= 0 else 0
        start = last_line_start(text, special_split + 1, shared - self._line_margin)
        if start < 0:
            return None
        kept = bisect_right(offsets, start)
        if kept - special_kept < self.min_line_gain or offsets[kept - 1] != start:
            return None  # too little to gain, or an old token spans the line start
        tail = encode_released(self._backend, text[start:])
        covers = mark == len(entry.marks) - 1 and start >= len(entry.text) - self._line_margin
        ids = self._splice(entry, mark, text, tail, start, kept, skip=0, covers=covers)
        if ids is not None:
            self.stats.line_hits += 1
        return ids

    def _splice(
        self,
        entry: _Entry,
        mark: int,
        text: str,
        tail: Any,
        start: int,
        kept: int,
        *,
        skip: int,
        covers: bool,
    ) -> list[int] | None:
        """Remember and return `text`'s ids: the entry's first `kept`, then the tail's (the
        encoding of `text[start:]`) from its token `skip` on. The tail's boundary tokens must
        sit where its offsets say (else None). `covers`: the new text makes the entry useless."""
        tail_ids: list[int] = tail.ids  # each read of `.ids` builds a new list
        ids = entry.ids[:kept]
        ids.extend(tail_ids[skip:])
        offsets = self._joined_offsets(entry, kept, tail, start, skip)
        marks, ends = entry.marks[: mark + 1], entry.ends[: mark + 1]
        for index in self._boundary_indices(tail_ids):
            if index < skip:
                continue
            chars = tail.token_to_chars(index)
            if (
                chars is None
                or text[start + chars[0] : start + chars[1]] != self.boundaries[tail_ids[index]]
            ):
                return None
            marks.append(start + chars[1])
            ends.append(kept - skip + index + 1)
        self.stats.partial_hits += 1
        self.stats.reused_tokens += kept
        if covers:
            self._forget(entry)
        self._remember(_Entry(text, ids, marks, ends, offsets))
        return ids.tolist()

    def _joined_offsets(
        self, entry: _Entry, kept: int, tail: Any, start: int, skip: int
    ) -> array[int] | None:
        """Token end offsets of the entry's first `kept` tokens followed by the tail's (from
        its token `skip` on, shifted by `start`); None where line starts are not splits."""
        if not self.line_splits or entry.offsets is None:
            return None
        joined = entry.offsets[:kept]
        joined.extend(start + end for _, end in tail.offsets[skip:])
        return joined

    def _tokenize(self, text: str) -> tuple[list[int], _Entry | None]:
        """All of `text`'s ids, and an entry to remember them by (None: offsets that do not
        match the text, so nothing about this text is trusted for later reuse)."""
        assert self._backend is not None
        encoding = encode_released(self._backend, text)
        ids: list[int] = encoding.ids
        marks: list[int] = []
        ends: list[int] = []
        for index in self._boundary_indices(ids):
            chars = encoding.token_to_chars(index)
            if chars is None or text[chars[0] : chars[1]] != self.boundaries[ids[index]]:
                return ids, None
            marks.append(chars[1])
            ends.append(index + 1)
        offsets = array("i", [end for _, end in encoding.offsets]) if self.line_splits else None
        return ids, _Entry(text, array("i", ids), marks, ends, offsets)

    def _boundary_indices(self, ids: list[int]) -> list[int]:
        """Indices of boundary tokens in `ids`, in order (list.index scans in C)."""
        found: list[int] = []
        for token_id in self.boundaries:
            at = -1
            while True:
                try:
                    at = ids.index(token_id, at + 1)
                except ValueError:
                    break
                found.append(at)
        found.sort()
        return found

    def _forget(self, entry: _Entry) -> None:
        for key, old in list(self._entries.items()):
            if old is entry:
                del self._entries[key]

    def _remember(self, entry: _Entry) -> None:
        if not entry.marks:
            return
        # A text that extends a remembered one replaces it: the new one covers it entirely.
        for key, old in list(self._entries.items()):
            if len(old.text) <= len(entry.text) and entry.text.startswith(old.text):
                del self._entries[key]
        self._entries[self._next_key] = entry
        self._next_key += 1
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)


def encode_released(backend: Any, text: str) -> Any:
    """`backend.encode(text, add_special_tokens=False)`, through `encode_batch`: the same
    encoding, but the Rust code runs without the GIL (`encode` holds it throughout: a 2 MiB
    prompt stopped the event loop, and with it `/health` and every stream, for 2.5 s)."""
    return backend.encode_batch([text], add_special_tokens=False)[0]


def common_prefix_length(a: str, b: str, block: int = 4096) -> int:
    """Length of the longest common prefix of two strings.

    Equal blocks of doubling size are skipped first, then the first differing block is
    halved down to the character: C-speed comparisons, and only about twice the shared
    length is ever copied (a different conversation stops at the first block).
    """
    limit = min(len(a), len(b))
    low = 0
    high = limit
    while low < limit:
        stop = min(limit, low + block)
        if a[low:stop] != b[low:stop]:
            high = stop
            break
        low = stop
        block *= 2
    else:
        return limit
    # a[:low] == b[:low] and a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle
    return low
