"""Cache-stable prompts: each request's prompt extends the previous request's prompt and the
turn generated for it, even where the chat template re-renders the past, so the prefix cache
prefills only what is new.

Why. Many real templates render a conversation's history differently once it grows: earlier
assistant turns lose their reasoning when a newer user message exists (Qwen3, GLM-4.6, gpt-oss,
MiniMax-M2, Kimi-K2-Thinking, DeepSeek-V3.2), the newest turns alone get an empty think block
(Qwen3 without thinking, Qwen3.5, DeepSeek-V3.2), tool definitions sit before the *last* user
message (Mistral-Small-3.2), a final answer closes with a token later turns write
otherwise (gpt-oss' `<|return|>`, then `<|end|>`). Under those templates every new user prompt
after a tool loop re-prefills everything since the previous one (10–30k tokens in a long Claude
Code session). Nothing here names a model family: everything is decided by rendering.

How. With r(msgs, generation) the template's render and a the last assistant turn of M:

- stable(M) = r(M, generation) when M has no assistant turn; else through(M[:a+1]) + tail(M, a).
  Where r(M, generation) already starts with through(M[:a+1]), it is used as it is: a template
  that never re-renders the past gives exactly its own output.
- through(M[:a+1]), the stable text through the end of assistant a as the model generated it:
  the prompt it was generated from, stable(M[:a]), then the turn as the template writes it while
  it is the newest message (r(M[:a+1]) past its common prefix with r(M[:a], generation)), the
  end of the generation prompt that this writes otherwise being replaced (a seam). Where adding
  the turn re-renders earlier ones (gpt-oss drops their analysis once a final answer follows),
  the same on variants of the past (below); else the template's own text.
- tail(M, a), what the template adds after assistant a, closest to the template first:
  r(M) past r(M[:a+1]) where the second is a prefix of the first, for the conversation as it is,
  then for variants where the past cannot move (reasoning removed from every assistant turn;
  then also no tools: tools a template writes near the last user message stay where the first
  prompt put them); else the turn's end found again in r(M) (its longest suffix found there
  once; what the template dropped before it — old reasoning, an empty think block — stays, unless
  it comes back later in r(M), moved rather than dropped); else a short seam (the turn's end
  re-rendered as the template now writes it: only that is re-prefilled); else a variant without
  the text beside calls; else a seam of any length; else the exact render (logged, debug).

Results are memoized per message prefix (a chained digest of the shaped messages, the tools and
the template's arguments) in a least-recently-used memo bounded by characters: a request of an
ongoing session costs about two template renders (exact mode: one). Measured on 60 tool rounds
(prompts of 190–240k characters, 2 shared CPU cores): 15–27 ms per request against 6–11 ms
exact; the first request of a session the memo does not hold (a restart, a changed tool list)
renders every turn once more: 0.7–1.4 s for those 60 rounds, against the full prefill such a
request pays anyway.

The trade-off, measured on the qwen3-0.6b fixture template and test tokenizer (tests/
test_stable_render_real.py: Claude Code's captured system prompt and 12 tools, a user prompt, a
system turn, 3 tool rounds and an answer, a new user prompt, 2 tool rounds and an answer, a new
user prompt; each assistant turn with ~50 tokens of reasoning, text and a call). Prompt tokens
per request, stable: 10,368 10,492 10,616 10,740 10,823 10,947 11,071 11,157; exact: 10,368
10,492 10,616 10,740 10,619 10,743 10,867 10,800. Stable keeps the reasoning the template drops,
+357 tokens (3%) in the last prompt, growing with the reasoning of every finished tool loop;
exact re-prefills the turns since the previous user prompt at each new one, 435 and 311 tokens
here (thousands with real reasoning and tool results), while stable re-prefills none of any
previous prompt. `--render exact` keeps the template's own behaviour.

Not thread-safe: the caller holds the renderer's lock.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal

# (messages, tools or None, add_generation_prompt) -> prompt text, the template's own render.
Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, bool], str]

# Variants of the conversation whose renders are compared where the plain ones disagree about
# the past, each a part removed from the past so it cannot move: (what is removed from earlier
# assistant turns, whether the tools are left out). Reasoning cannot move a past that holds
# none, nor text beside calls (gpt-oss shows it as analysis until a final answer) one without
# it, nor tools (Mistral writes them before the last user message) a render without tools.
Strip = Literal["nothing", "reasoning", "reasoning_and_text"]
Variant = tuple[Strip, bool]
VARIANTS: tuple[Variant, ...] = (
    ("nothing", False),
    ("reasoning", False),
    ("reasoning", True),
    ("reasoning_and_text", False),
    ("reasoning_and_text", True),
)
AS_IS: Variant = ("nothing", False)
# Where a message dict's reasoning may be (`template_shape.REASONING_FIELDS`, "content_blocks"
# being a thinking block in `content`).
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")

# Memo budget, in characters of memoized text (about 64 MB for ASCII prompts).
MEMO_BUDGET_CHARS = 64 * 1024 * 1024
# The end of a turn (or of a generation prompt) re-rendered otherwise is a seam of at most this
# many characters: a closing marker, an empty think block, a newline.
SEAM_CHARS = 256
# The shortest end of a turn that counts as found again in a new render (shorter ones match
# by chance).
ALIGN_MIN_CHARS = 16

log = logging.getLogger(__name__)


def common_prefix_length(a: str, b: str) -> int:
    """Characters `a` and `b` share at their start (compared in C, by halving)."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while high - low > 64:  # the answer lies in [low, high)
        middle = (low + high) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle
    while low < high and a[low] == b[low]:
        low += 1
    return low


def without_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message dict as `template_shape.message_to_template` writes it without
    reasoning (other roles unchanged)."""
    if message.get("role") != "assistant":
        return message
    out = {k: v for k, v in message.items() if k not in REASONING_KEYS}
    content = out.get("content")
    if isinstance(content, list):
        texts = [b for b in content if isinstance(b, dict) and b.get("type") != "thinking"]
        if all(b.get("type") == "text" for b in texts):
            out["content"] = "".join(str(b.get("text", "")) for b in texts)
        else:
            out["content"] = texts
    return out


def stripped(message: dict[str, Any], strip: Strip) -> dict[str, Any]:
    """`message` with what `strip` names removed (text only from turns that call tools)."""
    if strip == "nothing" or message.get("role") != "assistant":
        return message
    out = without_reasoning(message)
    if strip == "reasoning_and_text" and out.get("tool_calls"):
        out["content"] = ""
    return out


class TextMemo:
    """Texts by key, least recently used first out beyond `budget_chars` characters."""

    def __init__(self, budget_chars: int = MEMO_BUDGET_CHARS) -> None:
        self.budget_chars = budget_chars
        self.chars = 0
        self._texts: OrderedDict[tuple[str, bytes], str] = OrderedDict()

    def get(self, key: tuple[str, bytes]) -> str | None:
        text = self._texts.get(key)
        if text is not None:
            self._texts.move_to_end(key)
        return text

    def put(self, key: tuple[str, bytes], text: str) -> None:
        if len(text) > self.budget_chars:
            return
        previous = self._texts.pop(key, None)
        if previous is not None:
            self.chars -= len(previous)
        self._texts[key] = text
        self.chars += len(text)
        while self.chars > self.budget_chars:
            _, dropped = self._texts.popitem(last=False)
            self.chars -= len(dropped)

    def drop(self, key: tuple[str, bytes]) -> None:
        text = self._texts.pop(key, None)
        if text is not None:
            self.chars -= len(text)


def prefix_keys(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, context: str
) -> list[bytes]:
    """keys[n] names messages[:n] with these tools under this template `context`: a chain of
    digests, so every prefix's key costs one digest of one message."""
    head = json.dumps([context, tools], ensure_ascii=False, default=str)
    keys = [hashlib.blake2b(head.encode(), digest_size=16).digest()]
    for message in messages:  # key order kept: templates print arguments in their order
        text = json.dumps(message, ensure_ascii=False, default=str)
        keys.append(hashlib.blake2b(keys[-1] + text.encode(), digest_size=16).digest())
    return keys


class StableRenderer:
    """Renders conversations cache-stably for one tokenizer (see the module docstring).

    `render` takes the conversation already adapted and shaped for the template, the template
    render to use and a `context` string naming everything else the render depends on (the
    template text, its arguments), which keys the memo."""

    def __init__(self, budget_chars: int = MEMO_BUDGET_CHARS) -> None:
        self.memo = TextMemo(budget_chars)
        self.renders = 0  # template renders done (for tests and measurements)
        self.exact_fallbacks = 0  # prompts rendered exactly because nothing kept the past

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        render: Render,
        context: str,
        added: list[tuple[str, bytes]] | None = None,
    ) -> str:
        """The stable prompt; `added` (if given) receives the keys this render put into the
        memo, for `forget` when the prompt is refused."""
        return _Conversation(self, messages, tools, render, context, added).prompt()

    def forget(self, keys: list[tuple[str, bytes]]) -> None:
        """Drop what one render memoized (its prompt was refused: nothing will continue it,
        and it may be large)."""
        for key in keys:
            self.memo.drop(key)


class _Conversation:
    """One request's conversation: its prefixes' stable texts, memoized."""

    def __init__(
        self,
        owner: StableRenderer,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        render: Render,
        context: str,
        added: list[tuple[str, bytes]] | None = None,
    ) -> None:
        self._owner = owner
        self._added = added
        self._render = render
        self.messages = messages
        self.tools = tools
        self._keys = prefix_keys(messages, tools, context)
        self._assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        # Per strip: the messages with it applied, and how many leading ones are as the
        # plainer strip has them (made when first needed).
        self._stripped: dict[Strip, tuple[list[dict[str, Any]], int]] = {}
        # This request's results, whatever the shared memo keeps (bounds the recursion).
        self._local: dict[tuple[str, bytes], str] = {}

    def _cached(self, tag: str, length: int, compute: Callable[[], str]) -> str:
        key = (tag, self._keys[length])
        text = self._local.get(key)
        if text is None:
            text = self._owner.memo.get(key)
            if text is None:
                text = compute()
                self._owner.memo.put(key, text)
                if self._added is not None:
                    self._added.append(key)
            self._local[key] = text
        return text

    def _strip(self, strip: Strip) -> tuple[list[dict[str, Any]], int]:
        """The messages with `strip` applied, and how many leading ones are as the plainer
        strip has them."""
        if strip not in self._stripped:
            plainer = self.messages if strip == "reasoning" else self._strip("reasoning")[0]
            messages = [stripped(m, strip) for m in self.messages]
            pairs = enumerate(zip(plainer, messages, strict=True))
            same = next((i for i, (a, b) in pairs if a != b), len(messages))
            self._stripped[strip] = (messages, same)
        return self._stripped[strip]

    def variant(self, variant: Variant, length: int) -> Variant:
        """The plainest variant that renders as `variant` does when applied to messages[:length]
        only: where a strip removes nothing more there, or there are no tools to leave out, the
        plainer one."""
        strip, no_tools = variant
        no_tools = no_tools and self.tools is not None
        if strip == "reasoning_and_text" and length <= self._strip(strip)[1]:
            strip = "reasoning"
        if strip == "reasoning" and length <= self._strip(strip)[1]:
            strip = "nothing"
        return strip, no_tools

    def variants(self, length: int) -> list[Variant]:
        """The distinct variants of messages[:length], plainest first."""
        return list(dict.fromkeys(self.variant(v, length) for v in VARIANTS))

    def r(
        self, length: int, generation: bool, variant: Variant = AS_IS, keep_last: bool = False
    ) -> str:
        """The template's render of messages[:length] as `variant` has them (`keep_last`: the
        last message as it is, whatever the variant)."""
        strip, no_tools = self.variant(variant, length - 1 if keep_last else length)

        def compute() -> str:
            messages = self.messages[:length]
            if strip != "nothing":
                changed = self._strip(strip)[0]
                last = messages[-1:] if keep_last else changed[length - 1 : length]
                messages = [*changed[: length - 1], *last]
            self._owner.renders += 1
            return self._render(messages, None if no_tools else self.tools, generation)

        keep = keep_last and strip != "nothing"
        tag = f"render/{strip}/{int(no_tools)}/{int(generation)}/{int(keep)}"
        return self._cached(tag, length, compute)

    def prompt(self) -> str:
        # Earlier prompts first, so each one's predecessor is already known (no deep recursion).
        for index in self._assistants:
            if index:  # a conversation that opens with the assistant has no prompt before it
                self.stable(index)
        return self.stable(len(self.messages))

    def stable(self, length: int) -> str:
        """The stable prompt of messages[:length], generation prompt included."""
        return self._cached("stable", length, lambda: self._stable(length))

    def through(self, assistant: int) -> str:
        """The stable text through the end of the assistant turn at `assistant`, as the model
        generated it."""
        return self._cached("through", assistant + 1, lambda: self._through(assistant))

    def _stable(self, length: int) -> str:
        exact = self.r(length, True)
        earlier = [i for i in self._assistants if i < length]
        if not earlier:
            return exact
        last = earlier[-1]
        through = self.through(last)
        if exact.startswith(through):  # the template keeps this past as it was
            return exact
        text = self._continued(through, length, last)
        if text is None:
            self._owner.exact_fallbacks += 1
            log.debug(
                "stable render: the template re-renders the turn at message %d in a way no "
                "variant keeps; this prompt is the template's own (its past is re-prefilled)",
                last,
            )
            return exact
        return text

    def _through(self, assistant: int) -> str:
        if assistant == 0:  # the conversation opens with it: the template's text is all there is
            return self.r(1, False)
        previous = self.stable(assistant)
        # Earlier turns as the variant has them, this one as it is.
        for variant in self.variants(assistant):
            generation = self.r(assistant, True, variant)
            turn = self.r(assistant + 1, False, variant, keep_last=True)
            shared = common_prefix_length(generation, turn)
            # What the generation prompt writes that the turn's rendering writes otherwise (an
            # empty think block, or nothing): a seam, replaced by the turn. A longer one means
            # adding the turn re-rendered the past: the next variant may keep it.
            seam = generation[shared:]
            if len(seam) <= SEAM_CHARS and previous.endswith(seam):
                return previous[: len(previous) - len(seam)] + turn[shared:]
        log.debug(
            "stable render: adding the assistant turn at message %d re-renders the past in a "
            "way no variant keeps; the text through it is the template's own",
            assistant,
        )
        return self.r(assistant + 1, False)

    def _continued(self, through: str, length: int, last: int) -> str | None:
        """`through` followed by what the template adds after the assistant turn at `last`
        for messages[:length] (None: no way found).

        Cheapest and closest to the template first: a render that extends the turn's; the
        turn's end found again in the new render; a short seam (the turn's end re-rendered as
        the template now writes it; only that is re-prefilled); then renders without the text
        beside calls (gpt-oss drops it once a final answer follows; Gemma moves it after the
        results, which the steps before keep in its place); then a seam of any length."""
        variants = self.variants(length)
        plain = [v for v in variants if v[0] != "reasoning_and_text"]
        bare = [v for v in variants if v[0] == "reasoning_and_text"]
        pairs: dict[Variant, tuple[str, str]] = {}
        for variant in plain:  # rendered only as far as needed
            before, after = self.r(last + 1, False, variant), self.r(length, True, variant)
            if after.startswith(before):
                return through + after[len(before) :]
            pairs[variant] = (before, after)
        for variant, (before, after) in pairs.items():
            end = self._turn_end(variant, before, after, length, last)
            if end is not None:
                return through + after[end:]
        seams = [self._seamed(through, before, after) for before, after in pairs.values()]
        short = [(seam, t) for t, seam in seams if t is not None and seam <= SEAM_CHARS]
        if short:
            return min(short, key=lambda pair: pair[0])[1]
        for variant in bare:
            before, after = self.r(last + 1, False, variant), self.r(length, True, variant)
            if after.startswith(before):
                return through + after[len(before) :]
        # The shortest seam re-prefills least; one that keeps no more of the past than the
        # template's own render is no better than it.
        kept = common_prefix_length(self.r(length, True), through)
        texts = [t for t, _ in seams if t is not None and common_prefix_length(t, through) > kept]
        return max(texts, key=lambda t: common_prefix_length(t, through), default=None)

    def _turn_end(
        self, variant: Variant, before: str, after: str, length: int, last: int
    ) -> int | None:
        """Where the turn that `before` ends with ends in `after` (`_turn_end_in`), if what
        `after` dropped of it was dropped, not moved, and every later message follows it."""
        found = _turn_end_in(before, after)
        if found is None:
            return None
        end, dropped = found
        # What the new render dropped may be back later: moved (text written after the tool
        # results), so keeping it would write it twice. The generation prompt does not count
        # (it may open the empty think block the turns lost).
        if dropped and dropped in after[end:]:
            bare = self.r(length, False, variant)
            if not after.startswith(bare) or dropped in after[end : len(bare)]:
                return None
        return end if self._holds_messages(after[end:], last + 1, length) else None

    @staticmethod
    def _seamed(through: str, before: str, after: str) -> tuple[str | None, int]:
        """`through` with its end re-rendered as `after` writes it (None where `through` does
        not end as `before` does), and how many characters that re-renders."""
        shared = common_prefix_length(before, after)
        seam = len(before) - shared
        if not through.endswith(before[shared:]):
            return None, seam
        return through[: len(through) - seam] + after[shared:], seam

    def _holds_messages(self, tail: str, start: int, stop: int) -> bool:
        """Whether `tail` shows the start of every message in messages[start:stop] (as it is
        or JSON-escaped): a turn's end found again in the wrong place leaves some out."""
        for message in self.messages[start:stop]:
            content = message.get("content")
            probe = content.strip()[:32] if isinstance(content, str) else ""
            if probe and probe not in tail and json.dumps(probe)[1:-1] not in tail:
                return False
        return True


def _turn_end_in(before: str, after: str) -> tuple[int, str] | None:
    """Where `before` (a render ending with a turn) ends inside `after` (a longer render that
    re-rendered part of it), and what of `before` is not found there: the end of the one
    occurrence, past where the two stop agreeing, of `before`'s longest suffix that occurs
    there (at least ALIGN_MIN_CHARS; found by halving, since every shorter suffix of one that
    occurs occurs too). None where there is none, or it occurs twice (which one ends the turn
    would be a guess)."""
    shared = common_prefix_length(before, after)
    if shared >= len(before) or shared >= len(after):
        return None
    low, high = 0, len(before) - shared  # a suffix of length `low` occurs (0: trivially)
    while low < high:
        length = (low + high + 1) // 2
        if after.find(before[len(before) - length :], shared) >= 0:
            low = length
        else:
            high = length - 1
    if low < ALIGN_MIN_CHARS:
        return None
    suffix = before[len(before) - low :]
    found = after.find(suffix, shared)
    if after.find(suffix, found + 1) >= 0:
        return None
    return found + low, before[shared : len(before) - low].strip()
