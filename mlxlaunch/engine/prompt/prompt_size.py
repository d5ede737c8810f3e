"""A lower bound on a prompt's token count, found in work bounded by the context window.

A prompt that cannot fit the window is refused anyway; this finds that out without tokenizing
all of it, so a 32 MiB prompt costs what a window's worth of text costs, not 40 s and 4 GB.

Why. Tokenizing a prompt in full costs ~1.2 s and ~1 KB of memory per thousand characters
(2 shared cores, the test tokenizer): a 16 MiB prompt took 20 s and 3.6 GB before its 400.

How. Text is cut into pieces of about PIECE_CHARS characters, at a whitespace run where there
is one, and each piece is tokenized alone and counted (no ids kept). Tokenizers cut text into
pre-tokens at whitespace and tokenize those independently, so cut there the pieces' counts add
up to the whole's but for a token or so at each cut; measured equal on all 13 fixture
families' tokenizers on a 1.1M-character mix of code, prose, CJK, emoji and whitespace runs.
The bound is not left to that measurement: it takes SLACK_TOKENS off every piece and divides
the sum by CERTAINTY, and counting stops as soon as the bound reaches the limit. A prompt is
thus refused only when it holds at least twice the window's tokens, which no cut or template
trimming comes near; one under that is tokenized in full and checked exactly (O(window) too).

Counting is only started for text of more than COUNT_ABOVE_CHARS_PER_TOKEN characters per
window token, and more than EXACT_BELOW_CHARS in all: prompts that fit are ~3-4 characters a
token, so they never pay for it; one not counted costs at most that many characters'
tokenizing, O(window) again, and gets its exact count in the refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

PIECE_CHARS = 8192  # ~10 ms of tokenizing: other threads get the tokenizer between pieces
SLACK_TOKENS = 2  # tokens a cut may add: one pre-token split in two
CERTAINTY = 2  # the counted sum is divided by this before it is compared with the limit
COUNT_ABOVE_CHARS_PER_TOKEN = 8
EXACT_BELOW_CHARS = 1 << 18  # tokenized in full in ~0.3 s (without the GIL): an exact count
_LOOK_BACK = PIECE_CHARS // 2  # how far back from a piece's end a whitespace cut is sought


def text_pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """`text` in pieces of at most `size` characters (at least half that, but the last), cut
    before a whitespace run where the piece's second half has one, stripped of whitespace."""
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            cut = max(
                text.rfind(" ", end - _LOOK_BACK, end), text.rfind("\n", end - _LOOK_BACK, end)
            )
            # Before the whole run: a run is one pre-token (spaces before a word join the word).
            floor = max(start + 1, cut - 64)
            while cut > floor and text[cut - 1].isspace():
                cut -= 1
            if cut > start:
                end = cut
        piece = text[start:end].strip()
        if piece:
            yield piece
        start = end


def tokens_at_least(texts: Iterable[str], count: Callable[[str], int], limit: int) -> int:
    """A number of tokens that the text holding all of `texts` certainly has at least (each
    as it is, or trimmed of surrounding whitespace); counting stops once it reaches `limit`.

    `count(piece)` is the tokenizer's count for one piece (no special tokens added). Never
    more than the true count; at most about CERTAINTY × `limit` tokens' worth of text is
    counted, however long `texts` are.
    """
    counted = 0
    for text in texts:
        for piece in text_pieces(text):
            counted += max(0, count(piece) - SLACK_TOKENS)
            if counted // CERTAINTY >= limit:
                return counted // CERTAINTY
    return counted // CERTAINTY


def too_long_at_least(texts: list[str], count: Callable[[str], int], limit: int) -> int | None:
    """A lower bound on the tokens of text holding all of `texts` when it reaches `limit`;
    None where it does not, or where `texts` are too short for counting to be worth it."""
    if sum(map(len, texts)) <= max(COUNT_ABOVE_CHARS_PER_TOKEN * limit, EXACT_BELOW_CHARS):
        return None
    bound = tokens_at_least(texts, count, limit)
    return bound if bound >= limit else None
