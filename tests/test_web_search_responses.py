"""Web search for Codex: the Responses API's hosted `web_search` tool run through the same
search loop as the Messages API's, with the real OpenAI SDK against the real server and a
local HTTP server speaking SearXNG's API. Output items `web_search_call` (action search,
its query and sources), stream events `response.web_search_call.in_progress/.searching/
.completed`; without a backend, a failed call and a message that says how to set one up."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import Served, serve
from search_fakes import HITS, FakeSearch

from mlxlaunch.server.search_backends import SearchBackend
from mlxlaunch.server.web_search import WEB_SEARCH_NOT_CONFIGURED

pytestmark = pytest.mark.slow  # every test here serves a model

CALL = '<tool_call>\n{"name": "web_search", "arguments": {"query": "mlx arrays"}}\n</tool_call>'
ANSWER = "MLX is an array framework (https://ml-explore.github.io/mlx/build/html/index.html)."


@pytest.fixture(scope="module")
def codex(tiny_model_dir: Path, search_server: FakeSearch) -> Iterator[Served]:
    backend = SearchBackend("searxng", search_server.url, timeout_s=1.0)
    with serve(tiny_model_dir, sdk="openai", settings={"search": backend}) as server:
        yield server


def _create(served: Served, tool: dict[str, Any], **more: Any) -> Any:
    return served.client.responses.create(
        model="gpt-5-codex", input="What is MLX?", tools=[tool], max_output_tokens=200, **more
    )


def test_a_web_search_call_runs_and_the_model_answers(
    codex: Served, search_service: FakeSearch
) -> None:
    codex.scripted.enqueue(CALL)
    codex.scripted.enqueue(ANSWER)
    response = _create(codex, {"type": "web_search"})
    assert [item.type for item in response.output] == ["web_search_call", "message"]
    call, message = response.output
    assert call.id.startswith("ws_") and call.status == "completed"
    assert call.action.type == "search" and call.action.query == "mlx arrays"
    assert [source.url for source in call.action.sources] == [h["url"] for h in HITS]
    assert message.content[0].text == ANSWER
    assert search_service.queries == ["mlx arrays"]
    continued = codex.rendered(-1)
    assert HITS[0]["url"] in continued and HITS[0]["content"] in continued
    assert response.status == "completed"


def test_the_stream_has_the_search_events_in_order(
    codex: Served, search_service: FakeSearch
) -> None:
    codex.scripted.enqueue(CALL)
    codex.scripted.enqueue(ANSWER)
    kinds: list[str] = []
    with codex.client.responses.stream(
        model="gpt-5-codex",
        input="What is MLX?",
        tools=[{"type": "web_search_preview", "filters": {"allowed_domains": ["python.org"]}}],
        max_output_tokens=200,
    ) as events:
        for event in events:
            kinds.append(event.type)
        final = events.get_final_response()
    search = [k for k in kinds if "web_search_call" in k or "output_item" in k]
    assert search[:5] == [
        "response.output_item.added",
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
        "response.output_item.done",
    ]
    assert kinds[-1] == "response.completed"
    call = final.output[0]
    assert call.type == "web_search_call" and call.status == "completed"
    # filters.allowed_domains kept only the python.org hit.
    assert [source.url for source in call.action.sources] == [HITS[1]["url"]]
    assert final.output[1].content[0].text == ANSWER


def test_a_failing_backend_is_a_failed_call_and_the_model_goes_on(
    codex: Served, search_service: FakeSearch
) -> None:
    search_service.status = 500
    codex.scripted.enqueue(CALL)
    codex.scripted.enqueue("I could not search.")
    response = _create(codex, {"type": "web_search"})
    assert [item.type for item in response.output] == ["web_search_call", "message"]
    assert response.output[0].status == "failed"
    assert response.output[1].content[0].text == "I could not search."
    assert "web search failed: unavailable" in codex.rendered(-1)


def test_codex_sending_the_call_back_is_accepted(codex: Served) -> None:
    codex.scripted.enqueue(CALL)
    codex.scripted.enqueue(ANSWER)
    first = _create(codex, {"type": "web_search"}, store=False)
    history = [
        {"role": "user", "content": "What is MLX?"},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"role": "user", "content": "Thanks."},
    ]
    codex.scripted.enqueue("You are welcome.")
    second = codex.client.responses.create(
        model="gpt-5-codex", input=history, tools=[{"type": "web_search"}], max_output_tokens=50
    )
    assert second.output[-1].content[0].text == "You are welcome."


def test_without_a_backend_a_forced_search_says_how_to_configure_one(
    tiny_model_dir: Path,
) -> None:
    """No script: `tool_choice` naming the hosted tool forces the call through the grammar."""
    with serve(tiny_model_dir, sdk="openai", scripted=False) as server:
        response = _create(server, {"type": "web_search"}, tool_choice={"type": "web_search"})
    kinds = [item.type for item in response.output]
    assert kinds[-1] == "message" and set(kinds[:-1]) == {"web_search_call"}, kinds
    assert all(item.status == "failed" for item in response.output[:-1])
    assert response.output[-1].content[0].text == WEB_SEARCH_NOT_CONFIGURED
