"""`--model demo`: short, honest replies and a real tool round trip, served for real.

The replies are scripted at the model boundary (the demo's weights are random); the server, the
tool-call parser and the official SDK on the other side are all real, and the requests are the
ones Claude Code 2.1.332 sent.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from engine_helpers import serve

from mlxlaunch.engine.types import ChatMessage, GenerationRequest, ToolChoice, ToolSpec
from mlxlaunch.launch.models import demo_replies
from mlxlaunch.server.runner import ServerHandle
from mlxlaunch.testing import ensure_test_model
from mlxlaunch.testing.demo import DEMO_FILE_TEXT, demo_command, greeting, reply_for, value_for

pytestmark = pytest.mark.slow

BASH = ToolSpec("Bash", "Run a shell command", {"type": "object", "properties": {"command": {}}})


def _request(*messages: ChatMessage, **kw: Any) -> GenerationRequest:
    return GenerationRequest(messages=list(messages), max_tokens=256, **kw)


# --- the replies, without a model ----------------------------------------------------------


def test_a_greeting_says_what_the_demo_is_and_how_to_get_a_real_model() -> None:
    text = reply_for(_request(ChatMessage("user", "hi")), pull_hint="mlx models pull qwen-7b")
    assert text == greeting("mlx models pull qwen-7b")
    assert "random weights" in text and "mlx models pull qwen-7b" in text
    assert "<tool_call>" not in text


def test_a_file_request_becomes_a_bash_call_when_the_client_offers_bash() -> None:
    ask = ChatMessage("user", "<system-reminder>ctx</system-reminder>\ncreate the file notes.md")
    text = reply_for(_request(ask, tools=[BASH]))
    markup = text[text.index("<tool_call>") + len("<tool_call>") : text.index("</tool_call>")]
    call = json.loads(markup)
    assert call["name"] == "Bash"
    assert call["arguments"]["command"] == f"echo '{DEMO_FILE_TEXT}' > notes.md"
    # Without Bash, or with tools switched off, the same words get the greeting.
    assert reply_for(_request(ask)) == greeting(None)
    assert reply_for(_request(ask, tools=[BASH], tool_choice=ToolChoice("none"))) == greeting(None)


def test_a_backticked_command_is_run_as_given() -> None:
    assert demo_command("please run `ls -la /tmp` for me") == "ls -la /tmp"
    assert demo_command("make a file") == f"echo '{DEMO_FILE_TEXT}' > hello.txt"


def test_the_tool_result_is_reported_back() -> None:
    result = ChatMessage("tool", "made it\n", tool_call_id="call_1", name="Bash")
    text = reply_for(_request(ChatMessage("user", "create a file"), result, tools=[BASH]))
    assert text.startswith("The Bash call ran: made it.")
    failed = ChatMessage("tool", "boom", tool_call_id="c", name="Bash", is_error=True)
    assert "reported an error: boom" in reply_for(_request(ChatMessage("user", "x"), failed))


def test_thinking_is_closed_before_the_reply() -> None:
    text = reply_for(_request(ChatMessage("user", "hi"), thinking=True))
    assert text.endswith(greeting(None))
    assert "</think>\n\n" in text


def test_schema_values_fit_the_schema() -> None:
    import jsonschema

    schemas: list[dict[str, Any]] = [
        {
            "type": "object",
            "properties": {"title": {"type": "string", "maxLength": 40}},
            "required": ["title"],
        },
        {
            "type": "object",
            "properties": {
                "n": {"type": "integer", "minimum": 3},
                "ok": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "mode": {"enum": ["fast", "slow"]},
                "maybe": {"type": ["null", "string"]},
                "inner": {"type": "object", "properties": {"x": {"const": 1}}},
            },
        },
    ]
    for schema in schemas:
        jsonschema.validate(value_for(schema), schema)


def test_only_the_demo_model_gets_scripted_replies() -> None:
    assert demo_replies("demo") is not None
    assert demo_replies("tiny") is None
    assert demo_replies("qwen-coder-7b") is None


# --- served: the official SDK against the demo model, with Claude Code's own requests --------


@pytest.fixture(scope="module")
def demo_server() -> Iterator[ServerHandle]:
    with serve(ensure_test_model("demo"), logits_hook=demo_replies("demo")) as served:
        yield served.server


def _client(server: ServerHandle) -> Any:  # the SDK, untyped: tests send captured dicts
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)


# Fields the SDK's typed methods take; Claude Code's newer ones travel in `extra_body`.
SDK_FIELDS = {"model", "messages", "max_tokens", "system", "tools", "metadata", "thinking"}


def _captured(fixtures_dir: Path, name: str) -> dict[str, Any]:
    body = json.loads((fixtures_dir / name).read_text())["body"]
    body.pop("stream", None)
    return dict(body)


def _sdk_args(body: dict[str, Any]) -> dict[str, Any]:
    extra = {k: v for k, v in body.items() if k not in SDK_FIELDS}
    known = {k: v for k, v in body.items() if k in SDK_FIELDS}
    return {**known, "extra_body": extra, "timeout": 120}


def _with_prompt(body: dict[str, Any], prompt: str) -> dict[str, Any]:
    """Claude Code's print-mode request, with the user's words replaced by `prompt`."""
    body = copy.deepcopy(body)
    first = body["messages"][0]
    blocks = first["content"] if isinstance(first["content"], list) else []
    texts = [b for b in blocks if b.get("type") == "text" and "<system-reminder>" not in b["text"]]
    if texts:
        texts[-1]["text"] = prompt
    else:
        first["content"] = prompt
    return body


def test_claude_codes_say_hi_gets_the_greeting(
    demo_server: ServerHandle, fixtures_dir: Path
) -> None:
    body = _captured(fixtures_dir, "print-mode-request.json")
    with _client(demo_server).messages.stream(**_sdk_args(body)) as stream:
        message = stream.get_final_message()
    texts = [b.text for b in message.content if b.type == "text"]
    assert message.stop_reason == "end_turn"
    assert len(texts) == 1 and texts[0].startswith("Hi! I am mlxlaunch's demo model")
    assert "mlx models" in texts[0]


def test_claude_codes_tool_round_trip(demo_server: ServerHandle, fixtures_dir: Path) -> None:
    client = _client(demo_server)
    body = _with_prompt(_captured(fixtures_dir, "print-mode-request.json"), "create hi.txt")
    with client.messages.stream(**_sdk_args(body)) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    calls = [b for b in first.content if b.type == "tool_use"]
    assert [c.name for c in calls] == ["Bash"]
    assert calls[0].input["command"] == f"echo '{DEMO_FILE_TEXT}' > hi.txt"
    assert all("<tool_call>" not in b.text for b in first.content if b.type == "text")

    follow = copy.deepcopy(body)
    follow["messages"] += [
        {"role": "assistant", "content": [c.model_dump() for c in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": ""}],
        },
    ]
    second = client.messages.create(**_sdk_args(follow))
    assert second.stop_reason == "end_turn"
    assert second.content[-1].text.startswith("The Bash call ran (no output).")
    assert second.usage.cache_read_input_tokens > 0  # the first turn's prompt was reused


def test_claude_codes_title_request_gets_valid_json(
    demo_server: ServerHandle, fixtures_dir: Path
) -> None:
    body = _captured(fixtures_dir, "title-request.json")
    message = _client(demo_server).messages.create(**_sdk_args(body))
    assert json.loads(message.content[0].text) == {"title": "mlxlaunch demo"}
