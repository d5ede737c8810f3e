"""Messages semantics through the real server, engine and tiny model, with the SDK as client:
tool round trips, thinking, stop sequences, system turns and request errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from engine_helpers import BASH_CALL as CALL
from engine_helpers import BASH_TOOL as BASH
from engine_helpers import HI, LogitsRecorder, Served, recording_hook
from mlx_lm.tokenizer_utils import load as load_tokenizer
from stream_grammar import check_stream

from mlxlaunch.engine.config import EngineConfig
from mlxlaunch.engine.engine import Engine
from mlxlaunch.engine.types import (
    ChatMessage,
    Done,
    GenerationRequest,
    Sampling,
    TextDelta,
    ThinkingDelta,
)
from mlxlaunch.protocol.sse import parse_frames

pytestmark = pytest.mark.slow  # every test here builds, loads or serves a model


def both_ways(served: Served, script: str | list[int], **kwargs: Any) -> tuple[Any, Any]:
    """The same scripted reply non-streaming and streaming: (message, final streamed)."""
    results = []
    for stream in (False, True):
        if isinstance(script, str):
            served.scripted.enqueue(script)
        else:
            served.scripted.enqueue(tokens=script)
        if stream:
            with served.client.messages.stream(**kwargs) as s:
                results.append(s.get_final_message())
        else:
            results.append(served.client.messages.create(**kwargs))
    return results[0], results[1]


def _blocks(message: Any) -> list[dict[str, Any]]:
    out = []
    for block in message.content:
        data = block.to_dict()
        if data["type"] == "tool_use":
            data["id"] = "toolu_*"
        out.append(data)
    return out


# --- tools ------------------------------------------------------------------------------------


def test_tool_round_trip_renders_the_result_in_place(served: Served) -> None:
    served.scripted.enqueue("Checking." + CALL)
    first = served.client.messages.create(model="m", max_tokens=100, messages=HI, tools=[BASH])
    assert first.stop_reason == "tool_use"
    call = first.content[-1]
    assert call.type == "tool_use" and call.input == {"command": "ls"}

    served.scripted.enqueue("All done.")
    history = [
        *HI,
        {"role": "assistant", "content": [b.to_dict() for b in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "file-a\nfile-b"}
            ],
        },
    ]
    second = served.client.messages.create(
        model="m", max_tokens=100, messages=history, tools=[BASH]
    )
    assert second.stop_reason == "end_turn"
    assert [b.type for b in second.content] == ["text"]
    prompt = served.rendered()
    call_at = prompt.index('{"name": "Bash", "arguments": {"command": "ls"}}')
    result_at = prompt.index("<tool_response>\nfile-a\nfile-b\n</tool_response>")
    assert prompt.index("Checking.") < call_at < result_at < prompt.rindex("<|im_start|>assistant")
    # Counted like it is generated: the same rendered prompt.
    counted = served.client.messages.count_tokens(
        model="m",
        messages=history,
        tools=[BASH],
    )
    assert counted.input_tokens == second.usage.input_tokens + (
        second.usage.cache_read_input_tokens or 0
    )


def test_out_of_order_results_render_in_call_order(served: Served) -> None:
    calls = [
        {"type": "tool_use", "id": f"toolu_{n}", "name": "Bash", "input": {"command": n}}
        for n in ("one", "two")
    ]
    results = [
        {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": f"out-{n}"}
        for n in ("two", "one")
    ]
    served.scripted.enqueue("ok")
    served.client.messages.create(
        model="m",
        max_tokens=10,
        tools=[BASH],
        messages=[
            *HI,
            {"role": "assistant", "content": calls},
            {"role": "user", "content": results},
        ],
    )
    prompt = served.rendered()
    assert prompt.index("out-one") < prompt.index("out-two")


def test_inconsistent_tool_history_and_images_are_400(served: Served) -> None:
    with pytest.raises(anthropic.BadRequestError, match="does not match any tool_use"):
        served.client.messages.create(
            model="m",
            max_tokens=5,
            messages=[
                *HI,
                {"role": "assistant", "content": "no calls here"},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}],
                },
            ],
        )
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    with pytest.raises(anthropic.BadRequestError, match="does not accept images"):
        served.client.messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": [image]}]
        )
    with pytest.raises(anthropic.BadRequestError, match="not offered"):
        served.client.messages.create(
            model="m",
            max_tokens=5,
            messages=HI,
            tools=[BASH],
            tool_choice={"type": "tool", "name": "Nope"},
        )


def test_without_tools_markup_is_text(served: Served) -> None:
    message, streamed = both_ways(served, CALL, model="m", max_tokens=100, messages=HI)
    assert _blocks(message) == _blocks(streamed) == [{"type": "text", "text": CALL}]
    assert message.stop_reason == "end_turn"


def test_disable_parallel_tool_use_stops_after_one_call(served: Served) -> None:
    message, streamed = both_ways(
        served,
        CALL + "\n" + CALL.replace("ls", "pwd") + "\nmore text",
        model="m",
        max_tokens=200,
        messages=HI,
        tools=[BASH],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
    )
    assert _blocks(message) == _blocks(streamed)
    assert [b.type for b in message.content] == ["tool_use"] and message.stop_reason == "tool_use"


# --- thinking ---------------------------------------------------------------------------------


def test_thinking_enabled_gives_a_thinking_block_then_text(served: Served) -> None:
    reply = "Plan the answer.\n</think>\n\nHello!"
    kwargs: dict[str, Any] = {"model": "m", "max_tokens": 100, "messages": HI}
    message, streamed = both_ways(
        served, reply, thinking={"type": "enabled", "budget_tokens": 1024}, **kwargs
    )
    assert _blocks(message) == _blocks(streamed)
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "Plan the answer." and message.content[0].signature
    assert served.rendered().endswith("<|im_start|>assistant\n<think>\n")

    # Disabled: the template closes the think span in the prompt; the reply is all answer.
    message = both_ways(served, "Hello!", thinking={"type": "disabled"}, **kwargs)[0]
    assert [b.type for b in message.content] == ["text"]
    assert served.rendered().endswith("<think>\n\n</think>\n\n")


def test_display_omitted_sends_an_empty_thinking_block_with_a_signature(served: Served) -> None:
    served.scripted.enqueue("Secret plan.\n</think>\n\nHi.")
    raw = httpx.post(
        served.server.url + "/v1/messages",
        json={
            "model": "m",
            "max_tokens": 50,
            "messages": HI,
            "stream": True,
            "thinking": {"type": "adaptive", "display": "omitted"},
        },
        timeout=60,
    )
    summary = check_stream(parse_frames(raw.text))
    assert [b["type"] for b in summary.blocks] == ["thinking", "text"]
    thinking = summary.blocks[0]
    assert thinking["thinking"] == "" and thinking["signature"]
    assert "Secret plan" not in raw.text


async def test_thinking_budget_closes_the_span(tiny_model_dir: Path) -> None:
    logs: list[LogitsRecorder] = []
    engine = Engine(EngineConfig(model=str(tiny_model_dir), logits_hook=recording_hook(logs)))
    budget = 6
    request = GenerationRequest(
        messages=[ChatMessage("user", "think about it")],
        max_tokens=30,
        sampling=Sampling(temperature=1.0, seed=1),
        thinking=True,
        thinking_budget=budget,
    )
    try:
        events = [e async for e in engine.submit(request)]
        think_end = load_tokenizer(tiny_model_dir).encode("</think>", add_special_tokens=False)
    finally:
        engine.close()
    done = events[-1]
    assert isinstance(done, Done)
    log = logs[0]
    assert log.prompt_length is not None
    generated = log.context[log.prompt_length :]
    assert len(think_end) == 1
    # A random model never closes the span itself: exactly `budget` thinking tokens, then the
    # forced </think>, then the model goes on with its answer until max_tokens (the processor
    # sees every token but the last: no pass runs after a sequence's final token).
    assert done.stop_reason == "max_tokens" and len(generated) == 29
    assert generated.index(think_end[0]) == budget
    kinds = [type(e).__name__ for e in events if isinstance(e, ThinkingDelta | TextDelta)]
    assert kinds[0] == "ThinkingDelta" and "TextDelta" in kinds
    assert kinds.index("TextDelta") > len(kinds) - 1 - kinds[::-1].index("ThinkingDelta")


# --- stop sequences ---------------------------------------------------------------------------


def _pieces(served: Served, *parts: str) -> list[int]:
    """Tokens that decode to the concatenation of `parts`, split between them."""
    return [t for part in parts for t in served.tokenizer.encode(part, add_special_tokens=False)]


@pytest.mark.parametrize(
    ("parts", "stops", "text", "matched"),
    [
        (["alpha beta STOP gamma"], ["STOP"], "alpha beta ", "STOP"),
        (["alpha S", "T", "OP gamma"], ["STOP"], "alpha ", "STOP"),
        (["x", "ab", "cde"], ["abcd", "bc"], "xa", "bc"),
        (["abc", "d", "e"], ["bcd", "abcdz"], "a", "bcd"),
        (["tail END"], ["END"], "tail ", "END"),
        (["no STO", "P here, STOPPED"], ["STOPPED"], "no STOP here, ", "STOPPED"),
        (["near STO", "ne miss"], ["STOP"], "near STOne miss", None),
    ],
    ids=["in-one-delta", "across-deltas", "overlap", "overlap-2", "at-end", "long", "near-miss"],
)
def test_stop_sequences_agree_streaming_and_not(
    served: Served, parts: list[str], stops: list[str], text: str, matched: str | None
) -> None:
    message, streamed = both_ways(
        served,
        _pieces(served, *parts),
        model="m",
        max_tokens=100,
        messages=HI,
        stop_sequences=stops,
    )
    for result in (message, streamed):
        assert "".join(b.text for b in result.content if b.type == "text") == text
        assert result.stop_reason == ("stop_sequence" if matched else "end_turn")
        assert result.stop_sequence == matched


def test_a_stop_before_a_tool_call_suppresses_it(served: Served) -> None:
    message, streamed = both_ways(
        served,
        "Let me run it. HALT " + CALL,
        model="m",
        max_tokens=100,
        messages=HI,
        tools=[BASH],
        stop_sequences=["HALT"],
    )
    for result in (message, streamed):
        assert [b.type for b in result.content] == ["text"]
        assert result.stop_reason == "stop_sequence" and result.stop_sequence == "HALT"


# --- system turns -----------------------------------------------------------------------------


def test_mid_conversation_system_turn_renders_in_place(served: Served) -> None:
    base: list[dict[str, Any]] = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "second question"},
    ]
    for messages in (base, [*base, {"role": "system", "content": "Answer in French."}]):
        served.scripted.enqueue("ok")
        served.client.messages.create(
            model="m", max_tokens=5, system="You are terse.", messages=messages
        )
    without, with_turn = served.rendered(-2), served.rendered(-1)
    head = "<|im_start|>system\nYou are terse.<|im_end|>\n"
    assert without.startswith(head) and with_turn.startswith(head)
    assert with_turn.count("You are terse.") == 1
    # Everything up to the new turn is byte-identical: the cached prefix stays reusable.
    common = without[: without.rindex("<|im_start|>assistant")]
    assert with_turn.startswith(common)
    assert with_turn[len(common) :].startswith(
        "<|im_start|>system\nAnswer in French.<|im_end|>\n<|im_start|>assistant"
    )


# --- captured Claude Code requests ------------------------------------------------------------


def _post_captured(served: Served, fixtures_dir: Path, name: str, stream: bool) -> Any:
    """Send a captured Claude Code body as it was (raw HTTP: it carries fields the SDK's
    typed methods do not know); the streamed events are checked and folded into a message."""
    captured = json.loads((fixtures_dir / name).read_text())
    body = {**captured["body"], "stream": stream}
    response = httpx.post(served.server.url + captured["path"], json=body, timeout=120)
    assert response.status_code == 200, response.text
    if not stream:
        return response.json()
    summary = check_stream(parse_frames(response.text))
    return {"content": summary.blocks, "stop_reason": summary.stop_reason}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_claude_code_print_mode_gets_a_tool_call(
    served: Served, fixtures_dir: Path, stream: bool
) -> None:
    served.scripted.enqueue(
        "I will write the file.\n</think>\n\n"
        '<tool_call>\n{"name": "Bash", "arguments": {"command": "echo hi"}}\n</tool_call>'
    )
    message = _post_captured(served, fixtures_dir, "print-mode-request.json", stream)
    content = message["content"]
    assert [b["type"] for b in content] == ["thinking", "tool_use"]
    assert content[0]["thinking"] == "" and content[0]["signature"]  # display: omitted
    assert content[1]["name"] == "Bash" and content[1]["input"] == {"command": "echo hi"}
    assert message["stop_reason"] == "tool_use"


def test_claude_code_tool_result_turn_completes(served: Served, fixtures_dir: Path) -> None:
    served.scripted.enqueue("Checked.\n</think>\n\nThe file is written.")
    message = _post_captured(served, fixtures_dir, "tool-result-request.json", True)
    assert message["stop_reason"] == "end_turn"
    assert message["content"][-1] == {"type": "text", "text": "The file is written."}
    prompt = served.rendered()
    assert prompt.index("echo scripted-ok > proof.txt") < prompt.index(
        "(Bash completed with no output)"
    )


def test_claude_code_title_request_is_json_with_a_title(served: Served, fixtures_dir: Path) -> None:
    # No script: the random model writes it, the schema constraint keeps it valid.
    for stream in (True, False):
        message = _post_captured(served, fixtures_dir, "title-request.json", stream)
        assert message["stop_reason"] == "end_turn", message
        (block,) = message["content"]
        title = json.loads(block["text"])
        assert set(title) == {"title"} and isinstance(title["title"], str)
