"""Incremental tokenization gives exactly the full tokenization, and reuses what it can.

The reference everywhere is the tokenizer's own `encode(text, add_special_tokens=False)` on the
whole text. Random texts and conversations are built from the pieces that could break a split:
special tokens, fragments of them, whitespace runs, multi-byte characters and code.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.tokenizer_utils import load as load_tokenizer
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)
from transformers import PreTrainedTokenizerFast

from mlxlaunch.bench.config import BenchConfig
from mlxlaunch.bench.plan import build_plan
from mlxlaunch.bench.workloads import Conversation, first_turn
from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.prompt.incremental import (
    IncrementalTokenizer,
    boundary_tokens,
    common_prefix_length,
    last_line_start,
    line_starts,
)
from mlxlaunch.engine.prompt.render import PromptRenderer
from mlxlaunch.engine.types import ChatMessage, GenerationRequest, ToolCallRecord, ToolSpec

CORPUS = [
    "def main(argv):\n    return run(argv) if argv else None\n" * 20,
    "The quick brown fox jumps over the lazy dog. " * 20,
    "Grüße café naïve 日本語 🙂 русский ≤ ≥ →\n" * 10,
    "    for i in range(10):\n        total += i  # sum\n" * 20,
]
# Text pieces that stress a split: control tokens, near misses of them, whitespace, unicode.
PIECES = [
    "<|im_start|>", "<|im_end|>", "<|im_end|>\n", "<think>", "</think>", "<tool_call>",
    "<|im_", "end|>", "<|", "|>", "<", ">", "\n", "\n\n", " ", "   ", "\t", "\r\n", "user",
    "assistant", "system", "def f(x):", "return x", "    ", "é", "漢字", "🙂", "0123", "ab", "a",
    "Hello", " world", "'s", "...", "\u00a0", "b", "bc",
]  # fmt: skip


def hf_tokenizer(backend: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def byte_level_tokenizer(extra: list[AddedToken]) -> Tokenizer:
    """A small byte-level BPE (the Qwen/GPT style) with ChatML control tokens plus `extra`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")]
    )
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t in ("<think>", "</think>")])
    tokenizer.add_tokens(extra)
    return tokenizer


def metaspace_tokenizer(corpus: Iterable[str] = CORPUS, vocab_size: int = 300) -> Tokenizer:
    """A SentencePiece-style BPE trained on `corpus`: NFKC, and a "▁" prepended to the first
    piece only (not the test models' kind)."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer.decoder = decoders.Metaspace(prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>"], show_progress=False
    )
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


def chatml_metaspace_tokenizer() -> Tokenizer:
    """`metaspace_tokenizer` with ChatML's control tokens."""
    tokenizer = metaspace_tokenizer()
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")]
    )
    return tokenizer


TOKENIZERS = {
    "byte-level": lambda: byte_level_tokenizer([]),
    # "<|im_end|>\n" and "a<|im_start|>b" continue control tokens; "<sep>" eats whitespace;
    # "<Norm>" is normalized: no split after those, and exact results all the same.
    "adversarial": lambda: byte_level_tokenizer(
        [
            AddedToken("<|im_end|>\n", special=True, normalized=False),
            AddedToken("<sep>", rstrip=True, lstrip=True, normalized=False),
            AddedToken("<Norm>", normalized=True),
            AddedToken("end|><", normalized=False),
            AddedToken("a<|im_start|>b", normalized=False),
        ]
    ),
    "metaspace": chatml_metaspace_tokenizer,
}


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def tokenizer(request: pytest.FixtureRequest) -> PreTrainedTokenizerFast:
    return hf_tokenizer(TOKENIZERS[request.param]())


def reference(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


pieces = st.lists(st.sampled_from(PIECES) | st.text(max_size=6), max_size=40)
# A session of texts: each keeps some of the pieces of the one before, maybe less a few
# characters (a new turn, an edited message, a fresh session), then goes on with new pieces.
steps = st.lists(st.tuples(st.floats(0, 1), st.integers(0, 3), pieces), min_size=1, max_size=6)


@pytest.mark.slow
@pytest.mark.parametrize("min_line_gain", [32, 1])
def test_random_texts_and_split_points_tokenize_exactly(tokenizer: Any, min_line_gain: int) -> None:
    partial_hits = []

    @settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))
    @given(pieces, steps)
    def check(first: list[str], session: list[tuple[float, int, list[str]]]) -> None:
        encoder = IncrementalTokenizer(tokenizer, capacity=3, min_line_gain=min_line_gain)
        text = "".join(first)
        assert encoder.encode(text) == reference(tokenizer, text)
        previous = first
        for keep, trim, more in session:
            kept = "".join(previous[: round(len(previous) * keep)])
            text = kept[: len(kept) - trim] + "".join(more)
            assert encoder.encode(text) == reference(tokenizer, text), (previous, text)
            previous = [kept[: len(kept) - trim], *more]
        partial_hits.append(encoder.stats.partial_hits)

    check()
    assert sum(partial_hits) > 10  # the incremental path really ran
    # (How often line starts were the split varies with the examples drawn;
    # test_line_start_splits_are_exact makes sure they run.)


@pytest.mark.parametrize("name", ["byte-level", "adversarial"])
def test_line_start_splits_are_exact(name: str) -> None:
    tokenizer = hf_tokenizer(TOKENIZERS[name]())
    encoder = IncrementalTokenizer(tokenizer, min_line_gain=1)
    assert encoder.line_splits
    base = "<|im_start|>user\n" + "".join(CORPUS)
    lines = base.split("\n")
    texts = [base]
    # Edits deep inside one long message: change, cut or extend a line near the end.
    for back in (3, 5, 8, 13, 21):
        head = "\n".join(lines[:-back])
        texts += [
            head + "\n  x = y  \n" + lines[-back],
            head + "\nreturn 0<|im_end|>\n",
            head + lines[-back] + " extra words\n\n\tdone",
            head[: len(head) - back] + "é\r\n漢字 <think> ok",
        ]
    for text in texts:
        assert encoder.encode(text) == reference(tokenizer, text), text[-80:]
    assert encoder.stats.line_hits >= 10


def test_only_tokens_that_nothing_can_merge_across_are_split_points() -> None:
    tokenizer = hf_tokenizer(TOKENIZERS["adversarial"]())
    safe = set(boundary_tokens(tokenizer.backend_tokenizer).values())
    assert "</think>" in safe and "<|im_end|>\n" in safe
    assert "<|im_end|>" not in safe  # "<|im_end|>\n" could match across the split
    assert "<|im_start|>" not in safe  # so could "a<|im_start|>b"
    assert "<sep>" not in safe and "<Norm>" not in safe  # eats whitespace / normalized
    assert "end|><" in safe  # contains nothing after another token's text
    encoder = IncrementalTokenizer(tokenizer)
    for before, after in [("x a<|im_start|>", "b c"), ("y<|im_end|>", "\nz"), ("<sep>", "  r")]:
        encoder.encode(before + "<think>")
        assert encoder.encode(before + after) == reference(tokenizer, before + after)


# --- through the real chat template --------------------------------------------------------


@pytest.fixture(scope="module")
def chat_tokenizer(tiny_model_dir: Path) -> TokenizerWrapper:
    return load_tokenizer(tiny_model_dir)


TOOLS = [ToolSpec("Bash", "Run a shell command", {"type": "object", "properties": {}})]
contents = st.lists(st.sampled_from(PIECES) | st.text(max_size=8), max_size=12).map("".join)
message = st.one_of(
    st.builds(ChatMessage, st.just("user"), contents),
    st.builds(ChatMessage, st.just("assistant"), contents),
    st.builds(
        lambda text, arg: ChatMessage(
            "assistant", text, tool_calls=[ToolCallRecord("call_1", "Bash", {"command": arg})]
        ),
        contents,
        contents,
    ),
    st.builds(lambda text: ChatMessage("tool", text, tool_call_id="call_1", name="Bash"), contents),
)


@pytest.mark.slow
def test_random_conversations_render_to_exactly_the_full_tokenization(
    chat_tokenizer: TokenizerWrapper,
) -> None:
    renderer = PromptRenderer(chat_tokenizer)  # one renderer for all: its memory carries over

    @settings(max_examples=examples(120), deadline=None, suppress_health_check=list(HealthCheck))
    @given(contents, st.lists(message, min_size=1, max_size=8), st.integers(0, 8), st.booleans())
    def check(system: str, messages: list[ChatMessage], cut: int, thinking: bool) -> None:
        # The whole conversation, then a shorter one with a new last turn (an edit or a
        # new session with the same system prompt), then one that continues the first.
        for history in (messages, messages[:cut], [*messages, ChatMessage("user", system)]):
            request = GenerationRequest(
                messages=[ChatMessage("system", system), *history],
                max_tokens=4,
                tools=TOOLS,
                thinking=thinking,
            )
            text = renderer.render_text(request)
            assert renderer.render(request).tokens == reference(chat_tokenizer, text)

    check()
    assert renderer.encoder.stats.partial_hits > 10


def claude_code_request(conversation: Conversation) -> GenerationRequest:
    messages = [ChatMessage("system", conversation.system), *conversation.messages]
    return GenerationRequest(messages=messages, tools=list(conversation.tools), max_tokens=4)


@pytest.mark.slow
def test_a_claude_code_session_reuses_almost_every_token(chat_tokenizer: TokenizerWrapper) -> None:
    plan = build_plan(BenchConfig.create(quick=True, turns=3))
    renderer = PromptRenderer(chat_tokenizer)
    for conversation in [plan.cold, *plan.turns, *plan.warm]:
        request = claude_code_request(conversation)
        tokens = renderer.render(request).tokens
        assert tokens == reference(chat_tokenizer, renderer.render_text(request))
        assert renderer.render(request).tokens == tokens  # the same prompt again: exact hit
    stats = renderer.encoder.stats
    later = len(plan.turns) + len(plan.warm)  # everything after the cold prompt
    assert stats.misses == 1 and stats.partial_hits == later and stats.exact_hits == 1 + later
    # Every later prompt shared all but its last turn with the one before.
    assert stats.reused_tokens > 0.8 * len(tokens) * (1 + len(plan.warm))


@pytest.mark.slow
def test_a_new_session_splits_its_first_message_at_a_line_start(
    chat_tokenizer: TokenizerWrapper,
) -> None:
    # A new session shares the system prompt, tools and most of the first user message (the
    # environment reminder) and differs only at its end: no special token is near the change.
    plan = build_plan(BenchConfig.create(quick=False, turns=1, warm_sessions=2))
    renderer = PromptRenderer(chat_tokenizer)
    assert renderer.encoder.line_splits
    first, second = (claude_code_request(c) for c in plan.warm)
    renderer.render(first)
    tokens = renderer.render(second).tokens
    assert tokens == reference(chat_tokenizer, renderer.render_text(second))
    stats = renderer.encoder.stats
    assert stats.line_hits == 1
    assert stats.reused_tokens > len(tokens) - 64  # all but the changed line or so


def test_line_starts_are_splits_only_where_the_pre_tokenizer_allows() -> None:
    assert IncrementalTokenizer(hf_tokenizer(TOKENIZERS["byte-level"]())).line_splits
    # A SentencePiece-style tokenizer keeps "\n" inside pieces: only special tokens split.
    assert not IncrementalTokenizer(hf_tokenizer(TOKENIZERS["metaspace"]())).line_splits
    assert line_starts("a\nb\n c\n\nd\n", 0, 12) == [2, 8]
    assert last_line_start("a\nb\n c\n\nd\n", 0, 12) == 8
    assert last_line_start("a\nb\n c\n\nd\n", 0, 8) == 2
    assert last_line_start("abc", 0, 3) == -1


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=40), st.text(max_size=30), st.text(max_size=30), st.integers(1, 9))
def test_common_prefix_length_is_exact(shared: str, a: str, b: str, block: int) -> None:
    x, y = shared + a, shared + b
    differ = [i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q]
    expected = differ[0] if differ else min(len(x), len(y))
    assert common_prefix_length(x, y, block) == expected


@pytest.mark.slow
def test_a_growing_conversation_keeps_one_entry(chat_tokenizer: TokenizerWrapper) -> None:
    plan = build_plan(BenchConfig.create(quick=True, turns=5))
    renderer = PromptRenderer(chat_tokenizer)
    for conversation in plan.turns:
        renderer.render(claude_code_request(conversation))
    assert len(renderer.encoder._entries) == 1 and renderer.encoder.stats.partial_hits == 4


@pytest.mark.slow
def test_memory_is_bounded_and_least_recently_used_goes_first(
    chat_tokenizer: TokenizerWrapper,
) -> None:
    encoder = IncrementalTokenizer(chat_tokenizer, capacity=2)
    prompts = [f"<|im_start|>user\nsession {i}<|im_end|>\n<|im_start|>assistant\n" for i in "abc"]
    for prompt in prompts:
        encoder.encode(prompt)
    assert len(encoder._entries) == 2
    encoder.encode(prompts[0])  # forgotten: tokenized in full again
    assert encoder.stats.exact_hits == 0
    encoder.encode(prompts[2])
    assert encoder.stats.exact_hits == 1


@pytest.mark.slow
def test_restored_token_ids_prime_the_first_prompt_after_a_restart(
    chat_tokenizer: TokenizerWrapper,
) -> None:
    plan = build_plan(BenchConfig.create(quick=True))
    before = PromptRenderer(chat_tokenizer)
    saved = before.render(claude_code_request(plan.cold)).tokens  # what the disk cache holds
    restarted = PromptRenderer(chat_tokenizer)
    # "return" spelled letter by letter: decodes to text that tokenizes differently.
    letters = [chat_tokenizer.encode(c, add_special_tokens=False)[0] for c in "return"]
    assert len(chat_tokenizer.encode("return", add_special_tokens=False)) < len(letters)
    bogus = [*letters, saved[0]]
    assert restarted.warm([saved, letters, bogus]) == 1  # only an exact round trip is kept
    new_session = claude_code_request(first_turn(plan.prompt, "after-restart"))
    tokens = restarted.render(new_session).tokens
    assert tokens == reference(chat_tokenizer, restarted.render_text(new_session))
    assert restarted.encoder.stats.partial_hits == 1 and restarted.encoder.stats.misses == 0


class RewritingTokenizer(PreTrainedTokenizerFast):
    """Rewrites the text before encoding, as mlx-lm's NewlineTokenizer does."""

    def encode(self, text: Any, *args: Any, **kwargs: Any) -> Any:
        return super().encode(text.replace("\n", " "), *args, **kwargs)


def test_tokenizers_it_cannot_reason_about_are_tokenized_in_full() -> None:
    rewriting = RewritingTokenizer(tokenizer_object=byte_level_tokenizer([]))
    truncating = byte_level_tokenizer([])
    truncating.enable_truncation(max_length=8)
    for tokenizer in (rewriting, hf_tokenizer(truncating)):
        encoder = IncrementalTokenizer(tokenizer)
        assert not encoder.incremental
        text = "<|im_start|>user\nhello\nthere, a long line of text<|im_end|>\n"
        assert encoder.encode(text) == reference(tokenizer, text)


@pytest.mark.slow
async def test_a_restarted_engine_tokenizes_its_first_prompt_incrementally(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    plan = build_plan(BenchConfig.create(quick=True))
    turn = claude_code_request(plan.cold)
    first = Engine(EngineConfig(model=str(tiny_model_dir), cache_dir=tmp_path))
    try:
        for request in (turn, claude_code_request(plan.turns[1])):
            async for _ in first.submit(request):
                pass
    finally:
        first.close()  # the reused prefix is saved to disk on the way out
    restarted = Engine(EngineConfig(model=str(tiny_model_dir), cache_dir=tmp_path))
    try:
        await restarted.load()
        renderer = restarted._worker.renderer
        assert renderer is not None and renderer.encoder.stats.primed >= 1
        new_session = claude_code_request(first_turn(plan.prompt, "after-restart"))
        count = await restarted.count_tokens(new_session)
        assert renderer.encoder.stats.partial_hits == 1 and renderer.encoder.stats.misses == 0
        text = renderer.render_text(new_session)
        assert count == len(reference(renderer.tokenizer, text))
    finally:
        restarted.close()
