"""Web search run on this machine, end to end: the real server, engine and tiny model, the
Anthropic SDK as client, a real local HTTP server speaking SearXNG's API as the backend.

The model's call is scripted (or forced by tool_choice through the engine's grammar); the
server runs the query, answers with `server_tool_use` + `web_search_tool_result` blocks, and
continues the generation with the results in the prompt, so the model's next words are its
answer. No test reaches the internet.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from engine_helpers import Served, serve
from search_fakes import HITS, FakeSearch

from mlxlaunch.server.search_backends import SearchBackend
from mlxlaunch.server.web_search import decode_page

pytestmark = pytest.mark.slow  # every test here serves a model


def _call(query: str) -> str:
    return (
        '<tool_call>\n{"name": "web_search", "arguments": {"query": "' + query + '"}}\n</tool_call>'
    )


ANSWER = "MLX is an array framework (https://ml-explore.github.io/mlx/build/html/index.html)."
ASK = [{"role": "user", "content": "What is MLX? Search the web."}]


@pytest.fixture(scope="module")
def searching(tiny_model_dir: Path, search_server: FakeSearch) -> Iterator[Served]:
    backend = SearchBackend("searxng", search_server.url, timeout_s=1.0)
    with serve(tiny_model_dir, settings={"search": backend}) as server:
        yield server


@pytest.fixture
def served_search(searching: Served, search_service: FakeSearch) -> Served:
    return searching


def _ask(served: Served, tool: dict[str, Any], *, stream: bool = False, **more: Any) -> Any:
    kwargs: dict[str, Any] = {
        "model": "claude-haiku-4-5", "max_tokens": 200, "messages": ASK, "tools": [tool], **more
    }  # fmt: skip
    if stream:
        with served.client.messages.stream(**kwargs) as events:
            return events.get_final_message()
    return served.client.messages.create(**kwargs)


def _tool(**settings: Any) -> dict[str, Any]:
    return {"type": "web_search_20250305", "name": "web_search", **settings}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_the_search_runs_and_the_model_answers_from_its_results(
    served_search: Served, search_service: FakeSearch, stream: bool
) -> None:
    served_search.scripted.enqueue(_call("mlx arrays"))
    served_search.scripted.enqueue(ANSWER)
    message = _ask(served_search, _tool(max_uses=5), stream=stream)
    assert [b.type for b in message.content] == [
        "server_tool_use",
        "web_search_tool_result",
        "text",
    ]
    call, result, text = message.content
    assert call.id.startswith("srvtoolu_") and call.input == {"query": "mlx arrays"}
    assert search_service.queries == ["mlx arrays"]
    assert result.tool_use_id == call.id
    assert [(r.type, r.url, r.title) for r in result.content] == [
        ("web_search_result", h["url"], h["title"]) for h in HITS
    ]
    assert decode_page(result.content[0].encrypted_content) == HITS[0]["content"]
    assert result.content[0].page_age == HITS[0]["publishedDate"]
    assert text.text == ANSWER
    assert message.stop_reason == "end_turn"
    assert message.usage.server_tool_use.web_search_requests == 1
    # The continuation's prompt held the call and its results: the model answered from them.
    continued = served_search.rendered(-1)
    assert "mlx arrays" in continued and HITS[0]["url"] in continued
    assert HITS[0]["content"] in continued
    assert HITS[0]["url"] not in served_search.rendered(-2)


def test_calls_beyond_max_uses_get_max_uses_exceeded(
    served_search: Served, search_service: FakeSearch
) -> None:
    served_search.scripted.enqueue(_call("first"))
    served_search.scripted.enqueue(_call("second"))
    served_search.scripted.enqueue(ANSWER)
    message = _ask(served_search, _tool(max_uses=1))
    types = [b.type for b in message.content]
    assert types == [
        "server_tool_use", "web_search_tool_result", "server_tool_use",
        "web_search_tool_result", "text",
    ]  # fmt: skip
    assert search_service.queries == ["first"]  # the second never reached the backend
    assert isinstance(message.content[1].content, list)
    assert message.content[3].content.error_code == "max_uses_exceeded"
    assert message.usage.server_tool_use.web_search_requests == 1
    assert "max_uses_exceeded" in served_search.rendered(-1)  # the model was told


@pytest.mark.parametrize(
    ("settings", "kept"),
    [
        ({"allowed_domains": ["python.org"]}, [HITS[1]["url"]]),
        ({"blocked_domains": ["example.com", "github.io"]}, [HITS[1]["url"]]),
        (
            {"allowed_domains": ["ml-explore.github.io", "example.com"]},
            [HITS[0]["url"], HITS[2]["url"]],
        ),
    ],
    ids=["allowed", "blocked", "allowed-two"],
)
def test_domain_lists_filter_the_results(
    served_search: Served, settings: dict[str, Any], kept: list[str]
) -> None:
    served_search.scripted.enqueue(_call("mlx"))
    served_search.scripted.enqueue(ANSWER)
    message = _ask(served_search, _tool(**settings))
    assert [r.url for r in message.content[1].content] == kept


def test_both_domain_lists_are_a_400(served_search: Served) -> None:
    tool = _tool(allowed_domains=["a.com"], blocked_domains=["b.com"])
    with pytest.raises(anthropic.BadRequestError) as info:
        _ask(served_search, tool)
    assert "allowed_domains" in str(info.value) and "blocked_domains" in str(info.value)


@pytest.mark.parametrize(
    ("status", "delay_s", "code"),
    [(500, 0.0, "unavailable"), (429, 0.0, "too_many_requests"), (200, 3.0, "unavailable")],
    ids=["500", "429", "timeout"],
)
def test_a_failing_backend_is_the_tools_error_and_the_model_goes_on(
    served_search: Served, search_service: FakeSearch, status: int, delay_s: float, code: str
) -> None:
    search_service.status, search_service.delay_s = status, delay_s
    served_search.scripted.enqueue(_call("mlx"))
    served_search.scripted.enqueue("I could not search.")
    message = _ask(served_search, _tool(), stream=True)
    assert [b.type for b in message.content] == [
        "server_tool_use",
        "web_search_tool_result",
        "text",
    ]
    assert message.content[1].content.error_code == code
    assert message.content[2].text == "I could not search."
    assert message.usage.server_tool_use.web_search_requests == 0
    assert f"web search failed: {code}" in served_search.rendered(-1)


def test_a_client_call_beside_the_search_ends_the_turn_for_the_client(
    served_search: Served,
) -> None:
    read = {"name": "Read", "description": "read", "input_schema": {"type": "object"}}
    served_search.scripted.enqueue(
        _call("mlx") + '\n<tool_call>\n{"name": "Read", "arguments": {}}\n</tool_call>'
    )
    message = served_search.client.messages.create(
        model="claude-haiku-4-5", max_tokens=200, messages=ASK, tools=[_tool(), read]
    )
    types = [b.type for b in message.content]
    assert types == ["server_tool_use", "web_search_tool_result", "tool_use"], types
    assert message.stop_reason == "tool_use"


def test_tool_choice_forces_a_search_that_runs(
    tiny_model_dir: Path, search_service: FakeSearch
) -> None:
    """No script: the engine's grammar writes the forced call, the backend is asked its
    query, and the model goes on freely after the result (no second forced call)."""
    backend = SearchBackend("searxng", search_service.url, timeout_s=1.0)
    with serve(tiny_model_dir, settings={"search": backend}, scripted=False) as server:
        message = _ask(
            server, _tool(), max_tokens=60, tool_choice={"type": "tool", "name": "web_search"}
        )
    types = [b.type for b in message.content]
    assert types[:2] == ["server_tool_use", "web_search_tool_result"], types
    # The grammar may write several calls at once; each non-blank query reached the backend
    # (a blank one, written by random weights, is refused before any request).
    queries = [b.input["query"] for b in message.content if b.type == "server_tool_use"]
    assert all(isinstance(query, str) for query in queries)
    assert search_service.queries == [query.strip() for query in queries if query.strip()]
    assert message.usage.server_tool_use.web_search_requests == len(search_service.queries)


def test_the_next_turn_carries_the_search_back_and_continues_its_prompt(
    served_search: Served,
) -> None:
    """Claude Code sends the answer's blocks back on its next turn: accepted, and rendered as
    the call and its result exactly as the continuation saw them (so its cached prefix is
    reused)."""
    served_search.scripted.enqueue(_call("mlx arrays"))
    served_search.scripted.enqueue(ANSWER)
    first = _ask(served_search, _tool())
    continued = served_search.rendered(-1)
    history = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": "And who makes it?"},
    ]
    served_search.scripted.enqueue("Apple's machine learning research.")
    second = served_search.client.messages.create(
        model="claude-haiku-4-5", max_tokens=50, messages=history, tools=[_tool()]
    )
    assert [b.type for b in second.content] == ["text"]
    again = served_search.rendered(-1)
    assert again.startswith(continued), (continued[-300:], again[len(continued) - 300 :])
    assert ANSWER in again[len(continued) :]
    assert second.usage.cache_read_input_tokens > 0


def test_the_brave_backend_end_to_end(tiny_model_dir: Path, search_service: FakeSearch) -> None:
    """The keyed API through the whole path: the token goes in its header, the results come
    from Brave's `web.results` shape."""
    from search_fakes import BRAVE_TOKEN

    backend = SearchBackend("brave", search_service.url, api_key=BRAVE_TOKEN, timeout_s=1.0)
    with serve(tiny_model_dir, settings={"search": backend}) as server:
        server.scripted.enqueue(_call("mlx"))
        server.scripted.enqueue(ANSWER)
        message = _ask(server, _tool(blocked_domains=["example.com"]))
    assert search_service.queries == ["mlx"]
    assert [r.url for r in message.content[1].content] == [HITS[0]["url"], HITS[1]["url"]]
    assert message.content[1].content[0].page_age == HITS[0]["publishedDate"]
    assert message.content[2].text == ANSWER


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_client_that_leaves_during_the_search_gets_no_continuation(
    served_search: Served, search_service: FakeSearch, stream: bool
) -> None:
    """The client gives up while the backend is slow: the answer stops there, and the
    continuation (the model's second request) never runs."""
    import time

    import httpx

    search_service.delay_s = 1.5
    served_search.scripted.enqueue(_call("slow"))
    served_search.scripted.enqueue(ANSWER)
    before = len(served_search.scripted.requests)
    body = {
        "model": "claude-haiku-4-5", "max_tokens": 100, "messages": ASK, "stream": stream,
        "tools": [_tool()],
    }  # fmt: skip
    with (
        pytest.raises(httpx.ReadTimeout),
        httpx.stream(
            "POST", served_search.server.url + "/v1/messages", json=body, timeout=0.6
        ) as answer,
    ):
        for _ in answer.iter_bytes():
            pass
    time.sleep(2.5)  # the search ends; a continuation would have started by now
    assert search_service.queries == ["slow"]
    assert len(served_search.scripted.requests) == before + 1
    assert served_search.scripted.pending == 1
    # The unused script is taken by a plain request, so the next test starts clean.
    served_search.client.messages.create(model="m", max_tokens=60, messages=ASK)
    assert served_search.scripted.pending == 0
