"""A history that carries web searches back (Claude Code's next turn): each search's call
and result become the assistant call and tool message the server tool loop rendered, what
follows them the next assistant message; and the loop's pieces that need no server."""

from __future__ import annotations

from typing import Any

import pytest

from mlxlaunch.engine.types import ChatMessage, InvalidRequest, ToolCallRecord
from mlxlaunch.protocol.requests import MessagesRequest
from mlxlaunch.server.errors import engine_error
from mlxlaunch.server.mapping import to_generation_request
from mlxlaunch.server.search_backends import SearchResult
from mlxlaunch.server.web_search import (
    SearchOutcome,
    WebSearchPolicy,
    encode_page,
    search_call_messages,
)

HIT = SearchResult("https://docs.python.org/3/", "Python docs", "The documentation.", "1 day")
CALL = {
    "type": "server_tool_use",
    "id": "srvtoolu_a",
    "name": "web_search",
    "input": {"query": "py"},
}
RESULT = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_a",
    "content": [
        {
            "type": "web_search_result", "url": HIT.url, "title": HIT.title,
            "encrypted_content": encode_page(HIT.snippet), "page_age": HIT.page_age,
        }
    ],
}  # fmt: skip


def _messages(assistant: list[dict[str, Any]]) -> list[ChatMessage]:
    body = {
        "model": "m",
        "max_tokens": 10,
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        "messages": [
            {"role": "user", "content": "search"},
            {"role": "assistant", "content": assistant},
            {"role": "user", "content": "thanks"},
        ],
    }
    return to_generation_request(MessagesRequest.model_validate(body)).messages


def test_a_search_in_the_history_reads_as_the_loop_rendered_it() -> None:
    thinking = {"type": "thinking", "thinking": "look it up", "signature": "s"}
    text = {"type": "text", "text": "Let me look."}
    got = _messages([thinking, text, CALL, RESULT, {"type": "text", "text": "See [1]."}])
    outcome = SearchOutcome("srvtoolu_a", "web_search", "py", results=(HIT,))
    before = ChatMessage(role="assistant", content="Let me look.", reasoning="look it up")
    expected = [
        *search_call_messages(before, [outcome]),
        ChatMessage(role="assistant", content="See [1]."),
    ]
    assert got[1:-1] == expected
    assert got[1].tool_calls == [ToolCallRecord("srvtoolu_a", "web_search", {"query": "py"})]
    assert "The documentation." in got[2].content and HIT.url in got[2].content
    assert got[-1] == ChatMessage(role="user", content="thanks")


def test_an_error_result_and_a_client_call_after_it() -> None:
    error = {
        **RESULT,
        "content": {"type": "web_search_tool_result_error", "error_code": "unavailable"},
    }
    read = {"type": "tool_use", "id": "toolu_r", "name": "Read", "input": {}}
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "search"},
            {"role": "assistant", "content": [CALL, error, read]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_r", "content": "x"}],
            },
        ],
    }
    got = to_generation_request(MessagesRequest.model_validate(body)).messages
    assert [m.role for m in got] == ["user", "assistant", "tool", "assistant", "tool"]
    assert got[2].is_error and "web search failed: unavailable" in got[2].content
    assert got[3].tool_calls == [ToolCallRecord("toolu_r", "Read", {})]
    assert got[4].tool_call_id == "toolu_r"


def test_anthropics_own_encrypted_content_reads_as_title_and_url() -> None:
    foreign = {**RESULT, "content": [{**RESULT["content"][0], "encrypted_content": "EqQBCioIB..."}]}
    got = _messages([CALL, foreign])
    assert HIT.url in got[2].content and "The documentation." not in got[2].content


def test_a_result_without_its_call_is_a_400() -> None:
    with pytest.raises(InvalidRequest) as info:
        _messages([RESULT])
    assert engine_error(info.value).status == 400
    assert "srvtoolu_a" in str(info.value)


@pytest.mark.parametrize(
    ("policy", "url", "admitted"),
    [
        (WebSearchPolicy("w", allowed_domains=("python.org",)), "https://docs.python.org/3", True),
        (WebSearchPolicy("w", allowed_domains=("python.org",)), "https://notpython.org/", False),
        (
            WebSearchPolicy("w", allowed_domains=("https://www.python.org/x",)),
            "https://python.org",
            True,
        ),
        (
            WebSearchPolicy("w", blocked_domains=("example.com",)),
            "https://www.example.com/a",
            False,
        ),
        (WebSearchPolicy("w", blocked_domains=("example.com",)), "https://example.org/", True),
        (WebSearchPolicy("w"), "https://anything.net/", True),
    ],
)
def test_domain_lists(policy: WebSearchPolicy, url: str, admitted: bool) -> None:
    assert policy.admits(url) is admitted


def _responses(**body: Any) -> tuple[dict[str, WebSearchPolicy], Any]:
    from mlxlaunch.protocol.openai_responses import ResponsesRequest
    from mlxlaunch.server.images import TEXT_ONLY
    from mlxlaunch.server.responses_mapping import search_policies
    from mlxlaunch.server.responses_mapping import to_generation_request as responses_request

    request = ResponsesRequest.model_validate({"model": "m", "input": "hi", **body})
    policies = search_policies(request)
    gen, _ = responses_request(
        request, request.items, request_id="resp_1", images=TEXT_ONLY, thinks=False,
        context_window=None, searches=frozenset(policies),
    )  # fmt: skip
    return policies, gen


def test_codex_web_search_is_offered_with_or_without_a_backend() -> None:
    """Without a backend too: a call is then answered with how to configure one."""
    tools = [{"type": "web_search", "filters": {"allowed_domains": ["python.org"]}}]
    policies, gen = _responses(tools=tools)
    assert policies == {
        "web_search": WebSearchPolicy("web_search", allowed_domains=("python.org",))
    }
    assert [tool.name for tool in gen.tools] == ["web_search"] and gen.tool_choice.mode == "auto"
    policies, gen = _responses(tools=tools, tool_choice={"type": "web_search_preview"})
    assert [tool.name for tool in gen.tools] == ["web_search"]
    assert (gen.tool_choice.mode, gen.tool_choice.name) == ("tool", "web_search")
    # A client function of that name wins: the hosted tool is not offered under it.
    function = {"type": "function", "name": "web_search", "parameters": {"type": "object"}}
    policies, gen = _responses(tools=[*tools, function])
    assert policies == {} and [tool.name for tool in gen.tools] == ["web_search"]
