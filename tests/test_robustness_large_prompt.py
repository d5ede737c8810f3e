"""Robustness II, item 1: one large prompt no longer freezes the whole process.

Before: the prompt was parsed, rendered and tokenized in full before the context check, in C
calls holding the GIL — a 2 MiB prompt stalled `/health` 6 s, 8 MiB froze it 41 s (RSS to
2.4 GB) — and refused prompts stayed in memory. Now a prompt that cannot fit is refused in work
bounded by the window (engine/prompt/prompt_size.py), a large body is parsed in pieces off the
event loop (protocol/limits.py), tokenizing runs without the GIL, and a refused prompt leaves
nothing memoized. The bound must never refuse a prompt that fits: checked on every real
template family, on tokenizers of other designs, and on texts made to fool it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_helpers import served_engine
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from mlx_lm.tokenizer_utils import load as load_tokenizer
from test_render_incremental import metaspace_tokenizer
from tokenizers import Tokenizer

from mlxlaunch.engine.prompt.prompt_size import (
    PIECE_CHARS,
    text_pieces,
    tokens_at_least,
    too_long_at_least,
)
from mlxlaunch.engine.prompt.render import PromptRenderer, rendered_texts
from mlxlaunch.engine.types import ChatMessage, GenerationRequest, ToolCallRecord, ToolSpec
from mlxlaunch.protocol.limits import (
    LARGE_BODY_BYTES,
    PiecewiseJson,
    RequestLimitError,
    load_request_json,
)
from mlxlaunch.server.runner import ServerHandle
from mlxlaunch.testing.builder import build_model
from mlxlaunch.testing.templates import real_template_family
from mlxlaunch.testing.tokenizer import train_tokenizer, write_tokenizer

TEMPLATES = Path(__file__).parent / "fixtures" / "chat-templates"
FAMILIES = sorted(p.stem for p in TEMPLATES.glob("*.jinja"))
TOKEN = "large-prompt"
HEADERS = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
WORDS = ["alpha", "beta", "print(x)", "def", "{", "}", "é", "漢字", "\n", '"q"', "\t", "🙂"]

# Texts made to fool a piecewise count: no whitespace at all, whitespace runs longer than a
# piece, runs of one character (long tokens), CJK, emoji, escapes, markup, code.
TRICKY = [
    "x" * (3 * PIECE_CHARS),
    " " * (3 * PIECE_CHARS) + "word",
    "=" * (2 * PIECE_CHARS) + " " + "-" * PIECE_CHARS,
    "漢字テキスト" * 3000,
    "🙂" * 9000,
    ("    for i in range(10):\n        total += i  # sum\n" * 800),
    ("a " * 20000),
    ("\n\n\n\t  " * 5000),
    ("<|im_start|>user\nhi<|im_end|>\n" * 900),
    ("word" + " " * 61) * 700,
    "ab\u00a0cd\u3000ef " * 4000,
]


def mixed_text(chars: int, seed: int = 0) -> str:
    """`chars` characters of words, code, CJK and emoji (a 64K block repeated: fast to make)."""
    rng = random.Random(seed)
    block = " ".join(rng.choice(WORDS) for _ in range(16_000))
    return (block * (chars // len(block) + 1))[:chars]


def tricky_metaspace_tokenizer() -> Tokenizer:
    """A SentencePiece-style BPE trained on some of the tricky texts: not the test models' kind."""
    return metaspace_tokenizer([*TRICKY[5:8], mixed_text(20000)], vocab_size=600)


@pytest.fixture(scope="module")
def tokenizers_of_each_kind() -> dict[str, Tokenizer]:
    qwen = real_template_family(TEMPLATES / "qwen3-0.6b.jinja")
    return {"byte-level": train_tokenizer(qwen, 8192), "metaspace": tricky_metaspace_tokenizer()}


def counter(tokenizer: Tokenizer) -> Any:
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


# --- the bound -----------------------------------------------------------------------------


def test_the_bound_never_exceeds_the_true_count(tokenizers_of_each_kind: dict[str, Any]) -> None:
    for name, tokenizer in tokenizers_of_each_kind.items():
        count = counter(tokenizer)
        for text in [*TRICKY, mixed_text(200_000)]:
            true = count(text)
            bound = tokens_at_least([text], count, limit=10**9)
            assert bound <= true, (name, text[:40], bound, true)
            # Pieces counted alone add up to about the whole: the bound is not vacuous.
            if true > 1000 and len("".join(text.split())) > len(text) // 2:
                assert bound >= true // 3, (name, text[:40], bound, true)


@settings(max_examples=examples(40), deadline=None)
@given(
    st.lists(
        st.sampled_from([*TRICKY[:8], " ", "\n", "x", "é漢"]) | st.text(max_size=300),
        min_size=1,
        max_size=12,
    )
)
def test_the_bound_on_several_texts_never_exceeds_the_count_of_their_join(
    tokenizers_of_each_kind: dict[str, Any], texts: list[str]
) -> None:
    for tokenizer in tokenizers_of_each_kind.values():
        count = counter(tokenizer)
        joined = "<|im_end|>\n<|im_start|>user\n".join(texts)
        assert tokens_at_least(texts, count, limit=10**9) <= count(joined)


def test_counting_stops_at_the_limit_whatever_the_length() -> None:
    """O(window), not O(prompt): a 32 MiB text is refused after a few pieces."""
    seen: list[int] = []

    def count(piece: str) -> int:
        seen.append(len(piece))
        return len(piece) // 3  # ~3 characters a token

    text = mixed_text(32 * 1024 * 1024)
    bound = too_long_at_least([text], count, limit=40_960)
    assert bound is not None and bound >= 40_960
    assert sum(seen) < 40_960 * 3 * 2 * 1.2  # CERTAINTY × the window's worth, not 32 MiB


def test_text_that_cannot_reach_the_limit_is_not_counted() -> None:
    """Prompts that fit (~4 characters a token) pay nothing for the bound."""

    def count(piece: str) -> int:
        raise AssertionError("counted")

    assert too_long_at_least([mixed_text(100_000)], count, limit=40_960) is None


def test_pieces_cover_the_text_but_whitespace_and_are_bounded() -> None:
    for text in TRICKY:
        pieces = list(text_pieces(text))
        assert all(0 < len(p) <= PIECE_CHARS for p in pieces)
        assert "".join(text.split()) == "".join("".join(p.split()) for p in pieces)


@pytest.mark.slow  # writes a tokenizer per family (seconds each)
@pytest.mark.parametrize("family", FAMILIES)
def test_the_bound_before_rendering_never_exceeds_any_real_templates_prompt(
    family: str, tmp_path: Path
) -> None:
    """What the bound counts before rendering (system, user and tool text) every real
    template writes into the prompt; whitespace a template trims is not counted."""
    write_tokenizer(tmp_path, real_template_family(TEMPLATES / f"{family}.jinja"), 8192, 40960)
    renderer = PromptRenderer(load_tokenizer(tmp_path))
    pad = "   \n\n  "
    call = ToolCallRecord(id="toolu_01", name="bash", arguments={"command": "ls " * 50})
    tool = ToolSpec(name="bash", description="run", parameters={"type": "object"})
    for text in [mixed_text(30_000), TRICKY[1][:9000], TRICKY[5][:20000], TRICKY[9][:30000]]:
        messages = [
            ChatMessage(role="system", content=pad + text[:3000] + pad),
            ChatMessage(role="user", content=pad + text + pad),
            ChatMessage(role="assistant", content="ok " + text[:500], tool_calls=[call]),
            ChatMessage(role="tool", content=pad + text[:8000], tool_call_id="toolu_01"),
            ChatMessage(role="user", content=text[:4000] + pad),
        ]
        request = GenerationRequest(messages=messages, max_tokens=8, tools=[tool])
        true = len(renderer.render(request).tokens)
        bound = tokens_at_least(rendered_texts(request), renderer._count, limit=10**9)
        assert bound <= true, (family, bound, true)


# --- the body parse -----------------------------------------------------------------------

json_strings = st.text(
    st.sampled_from([*'ab "\\/\n\t\x01é漢🙂', "\ud83d", "\ude00", "\udc00"]), max_size=300
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | json_strings,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(json_strings, inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=examples(300), deadline=None)
@given(json_values, st.booleans(), st.integers(17, 80), st.data())
def test_the_piecewise_parse_gives_what_json_loads_gives(
    value: Any, ascii_only: bool, piece: int, data: st.DataObject
) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    if data.draw(st.booleans()):  # a corrupt document: both refuse it
        at = data.draw(st.integers(0, len(text)))
        text = (
            text[:at]
            + data.draw(st.sampled_from(['"', "\\", ",", "}", "\x02", "\\u1"]))
            + text[at:]
        )
    try:
        expected: Any = json.loads(text)
    except json.JSONDecodeError:
        with pytest.raises(json.JSONDecodeError):
            PiecewiseJson(text, 64, piece=piece).document()
        return
    assert repr(PiecewiseJson(text, 64, piece=piece).document()) == repr(expected)


def test_a_large_body_parses_to_the_same_value_and_refuses_what_json_loads_refuses() -> None:
    content = mixed_text(LARGE_BODY_BYTES) + '\\ " \ud83d\ude00 \x7f'
    body = json.dumps({"messages": [{"role": "user", "content": content}], "n": [1, 2.5, None]})
    assert len(body.encode()) > LARGE_BODY_BYTES
    assert load_request_json(body.encode()) == json.loads(body)
    assert load_request_json(b"\xef\xbb\xbf" + body.encode()) == json.loads(body)
    with pytest.raises(json.JSONDecodeError):
        load_request_json(body.encode()[:-1])
    with pytest.raises(RequestLimitError):  # too deep, in a large body
        load_request_json(("[" * 100 + "]" * 100 + " " * LARGE_BODY_BYTES).encode())
    with pytest.raises(RequestLimitError):  # an integer Python will not hold
        load_request_json(b'{"a": ' + b"7" * 5000 + b"}" + b" " * LARGE_BODY_BYTES)


def test_a_large_body_leaves_the_gil_to_other_threads() -> None:
    """json.loads held it 200 ms for 32 MiB: an event loop would have stopped that long."""
    body = json.dumps({"messages": [{"content": mixed_text(32 * 1024 * 1024 - 200)}]}).encode()
    expected = json.loads(body)  # the stall the piecewise parse must beat, on this machine
    parsed: list[Any] = []
    tries: list[tuple[float, float]] = []
    # On a busy machine the whole process can be descheduled for longer than either parse
    # holds the GIL, which shows as a gap in both: a try passes when the piecewise parse let
    # the other thread run clearly more often; one of three must.
    for _ in range(3):
        stall = gaps_while(lambda: json.loads(body))
        piecewise = gaps_while(lambda: parsed.append(load_request_json(body)))
        tries.append((piecewise, stall))
        if piecewise < max(stall * 0.75, 0.05):
            break
    assert parsed[0] == expected
    assert any(piecewise < max(stall * 0.75, 0.05) for piecewise, stall in tries), tries


def gaps_while(work: Any) -> float:
    """The longest time another thread waited to run while `work` ran."""
    gaps: list[float] = []
    done = threading.Event()

    def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    thread = threading.Thread(target=ticker)
    thread.start()
    time.sleep(0.02)
    try:
        work()
    finally:
        done.set()
        thread.join()
    return max(gaps)


# --- the live server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    directory = build_model(tmp_path_factory.mktemp("tiny"), "tiny", template="qwen")
    with served_engine(Path(directory), TOKEN) as (_, handle):
        # Loaded and warm: the figures below are about the big prompt only.
        assert post(handle, "/v1/messages", message_body("hi")).status_code == 200
        yield handle


def message_body(content: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 2,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


def post(server: ServerHandle, path: str, payload: bytes | dict[str, Any]) -> httpx.Response:
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return httpx.post(server.url + path, content=content, headers=HEADERS, timeout=180)


def body_of_mib(mib: float, seed: int = 0) -> bytes:
    """A /v1/messages body of one user message, just under `mib` MiB (the limit is 32)."""
    limit = int(mib * 1024 * 1024) - 256
    text = mixed_text(limit, seed)
    body = json.dumps(message_body(text), ensure_ascii=False).encode()
    return json.dumps(
        message_body(text[: len(text) - (len(body) - limit)]), ensure_ascii=False
    ).encode()


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return math.nan


def trimmed_rss_mb() -> float:
    """RSS once the allocator has handed back what is free (what is still held remains)."""
    with contextlib.suppress(OSError):  # not glibc: RSS as it is
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mb()


class Watch:
    """Polls /health and samples RSS in the background while a request runs."""

    def __init__(self, server: ServerHandle) -> None:
        self.server = server
        self.latencies: list[float] = []
        self.rss: list[float] = []
        self._done = threading.Event()
        self._threads = [threading.Thread(target=self._health), threading.Thread(target=self._mem)]

    def __enter__(self) -> Watch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        for thread in self._threads:
            thread.join()

    def _health(self) -> None:
        with httpx.Client(timeout=300) as client:
            while not self._done.is_set():
                started = time.perf_counter()
                assert client.get(self.server.url + "/health").status_code == 200
                self.latencies.append(time.perf_counter() - started)
                time.sleep(0.02)

    def _mem(self) -> None:
        while not self._done.is_set():
            self.rss.append(rss_mb())
            time.sleep(0.05)


def baseline_health(server: ServerHandle) -> float:
    """The slowest /health answer over a second with nothing else to do (a busy machine's)."""
    with Watch(server) as watch:
        time.sleep(1.0)
    return max(watch.latencies)


def assert_too_long(response: httpx.Response, window: int = 40960) -> int:
    assert response.status_code == 400, response.text[:300]
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    message = error["error"]["message"]
    assert message.startswith("prompt is too long: ") and message.endswith(f"> {window} maximum")
    tokens = int(message.split(": ")[1].split()[0])
    assert tokens >= window
    return tokens


@pytest.mark.slow
def test_a_32_mib_prompt_is_refused_quickly_and_health_answers_throughout(
    server: ServerHandle,
) -> None:
    """Before: minutes of tokenizing with `/health` frozen (8 MiB: 41 s), RSS +4 GB."""
    quiet = baseline_health(server)
    body = body_of_mib(32)
    start_rss = rss_mb()
    with Watch(server) as watch:
        started = time.perf_counter()
        response = post(server, "/v1/messages", body)
        took = time.perf_counter() - started
    assert_too_long(response)
    del body
    # The old stall was the whole tokenizing (tens of seconds); the goal is < 100 ms on a quiet
    # machine. A busy shared one slows everything alike, so the bound is relative to its quiet
    # latency, with a floor that is still a tenth of the smallest stall seen before.
    assert max(watch.latencies) < max(0.6, 10 * quiet), (watch.latencies, quiet)
    assert took < 60, took
    assert max(watch.rss) - start_rss < 1500, (start_rss, max(watch.rss))


@pytest.mark.slow
def test_count_tokens_refuses_a_prompt_that_cannot_fit_in_bounded_work(
    server: ServerHandle,
) -> None:
    payload = json.loads(body_of_mib(8))
    del payload["max_tokens"]
    started = time.perf_counter()
    assert_too_long(post(server, "/v1/messages/count_tokens", payload))
    assert time.perf_counter() - started < 30
    # Exact, over the window too, where counting is cheap (the old behaviour).
    small = post(server, "/v1/messages/count_tokens", {**payload, "messages": [
        {"role": "user", "content": mixed_text(60_000)}
    ]})  # fmt: skip
    assert small.status_code == 200 and small.json()["input_tokens"] > 0


@pytest.mark.slow
def test_refused_prompts_do_not_stay_in_memory(server: ServerHandle) -> None:
    """Before: four distinct 3 MiB prompts took RSS from 131 to 458 MB, after idle."""
    before = trimmed_rss_mb()
    for seed in range(4):
        assert_too_long(post(server, "/v1/messages", body_of_mib(3, seed)))
    time.sleep(0.5)
    assert trimmed_rss_mb() - before < 150, (before, trimmed_rss_mb())


@pytest.mark.slow
def test_a_prompt_that_fits_is_never_refused_by_the_bound(server: ServerHandle) -> None:
    """Long whitespace runs: far more characters than the window has tokens, so the bound
    counts it, but it fits; it is answered."""
    text = ("x = 1" + " " * 250 + "\n") * 1400  # 360k characters, ~16 a token
    counted = post(server, "/v1/messages/count_tokens", {"model": "m", "messages": [
        {"role": "user", "content": text}
    ]})  # fmt: skip
    assert counted.status_code == 200, counted.text
    tokens = counted.json()["input_tokens"]
    assert tokens < 40960 < len(text) // 8  # the bound was consulted (see prompt_size), it fits
    response = post(server, "/v1/messages", message_body(text))
    assert response.status_code == 200, response.text[:300]
