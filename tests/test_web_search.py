"""The web search server tool without a configured backend, through the real server, engine
and tiny model with the SDK as client: the model is offered the tool, its call comes back as
a `server_tool_use` block answered by the API's error result and a text block saying how to
configure a backend, never as a client `tool_use`, never silently dropped."""

from __future__ import annotations

from typing import Any

import pytest
from engine_helpers import Served

from mlxlaunch.server.web_search import WEB_SEARCH_NOT_CONFIGURED

pytestmark = pytest.mark.slow  # every test here serves a model

WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 8}
SEARCH_CALL = '<tool_call>\n{"name": "web_search", "arguments": {"query": "mlx"}}\n</tool_call>'
ASK = [{"role": "user", "content": "Perform a web search for the query: mlx"}]


def _check_unconfigured_answer(message: Any) -> None:
    types = [block.type for block in message.content]
    assert types == ["server_tool_use", "web_search_tool_result", "text"]
    call, result, text = message.content
    assert call.id.startswith("srvtoolu_") and call.name == "web_search"
    assert call.input == {"query": "mlx"}
    assert result.tool_use_id == call.id
    assert result.content.type == "web_search_tool_result_error"
    assert result.content.error_code == "unavailable"
    assert "mlx config set search.backend" in text.text
    assert message.stop_reason == "end_turn"  # nothing is left for the client to run


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_unconfigured_web_search_is_an_honest_tool_error(served: Served, stream: bool) -> None:
    served.scripted.enqueue(SEARCH_CALL)
    kwargs: dict[str, Any] = {
        "model": "claude-haiku-4-5", "max_tokens": 64, "messages": ASK, "tools": [WEB_SEARCH]
    }  # fmt: skip
    if stream:
        with served.client.messages.stream(**kwargs) as events:
            message = events.get_final_message()
    else:
        message = served.client.messages.create(**kwargs)
    _check_unconfigured_answer(message)
    # The model was offered the tool (it is in the prompt it saw).
    assert '"web_search"' in served.rendered()


def test_tool_choice_naming_the_server_tool_forces_the_call(tiny_served: Served) -> None:
    """No script: the engine's own tool-call grammar writes the forced call."""
    message = tiny_served.client.messages.create(
        model="claude-haiku-4-5",
        max_tokens=300,
        messages=ASK,
        tools=[WEB_SEARCH],
        tool_choice={"type": "tool", "name": "web_search"},
    )
    types = [block.type for block in message.content]
    # The grammar may write several calls at once: each is answered, then one text says why.
    assert types[-1] == "text" and len(types) % 2 == 1, types
    assert types[:-1] == ["server_tool_use", "web_search_tool_result"] * (len(types) // 2)
    assert isinstance(message.content[0].input.get("query"), str)
    assert WEB_SEARCH_NOT_CONFIGURED in message.content[-1].text


@pytest.fixture(scope="module")
def tiny_served(tiny_model_dir: Any) -> Any:
    from engine_helpers import serve

    with serve(tiny_model_dir, scripted=False) as server:
        yield server
