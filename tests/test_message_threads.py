"""Message threads (the SDKs' default for tool runners) served for real: the official Python
SDK's `beta.messages.tool_runner` and `beta.messages.thread()` in their default modes run a
multi-turn tool loop against a real server; turns 2+ reuse the whole stored history's KV; a
lost thread gets the 400 the SDK recovers from."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import pytest
from anthropic import beta_tool
from engine_helpers import serve

from mlxlaunch.server.runner import ServerHandle
from mlxlaunch.server.threads import ThreadLimits
from mlxlaunch.testing.scripted import ScriptedOutput

pytestmark = pytest.mark.slow  # every test here serves a model

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THREADS_BETA = "message-threads-2026-08-12"


@dataclass
class Served:
    server: ServerHandle
    scripted: ScriptedOutput
    seen: list[dict[str, Any]]  # the bodies the server received, in order

    @property
    def client(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=self.server.url,
            api_key="x",
            max_retries=0,
            http_client=httpx2.Client(event_hooks={"request": [self._record]}),
        )

    def _record(self, request: httpx2.Request) -> None:
        if request.url.path == "/v1/messages":
            self.seen.append(json.loads(request.content))


def _serve(model: Path, tmp: Path, **limits: Any) -> Iterator[Served]:
    settings = {"thread_limits": ThreadLimits(**limits), "threads_dir": tmp / "threads"}
    with serve(model, settings=settings) as served:
        yield Served(served.server, served.scripted, [])


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _serve(tiny_model_dir, tmp_path_factory.mktemp("threads"))


@pytest.fixture
def forgetful(tiny_model_dir: Path, tmp_path: Path) -> Iterator[Served]:
    """A server whose threads expire at once: every `continue` finds nothing."""
    yield from _serve(tiny_model_dir, tmp_path, ttl_s=0.0)


calls: list[str] = []


@beta_tool
def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city's name.
    """
    calls.append(city)
    return f"It is sunny in {city}."


def _prompt_of(served: Served, index: int) -> str:
    """What the engine was asked to continue, as text (user and tool turns in order)."""
    return json.dumps([m.content for m in served.scripted.requests[index].messages])


def test_the_default_tool_runner_completes_a_tool_loop_over_a_thread(served: Served) -> None:
    calls.clear()
    served.seen.clear()
    served.scripted.enqueue("Let me look." + CALL)
    served.scripted.enqueue("Sunny in Paris.")
    runner = served.client.beta.messages.tool_runner(
        model="m",
        max_tokens=64,
        tools=[get_weather],
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    replies = list(runner)
    assert calls == ["Paris"]
    assert [r.stop_reason for r in replies] == ["tool_use", "end_turn"]
    assert replies[-1].content[-1].text == "Sunny in Paris."
    first, second = served.seen[-2:]
    assert first["thread"] == {"type": "create"}
    assert second["thread"] == {"type": "continue", "previous_message_id": replies[0].id}
    # The continue sent only the tool result, without system or tools...
    assert [m["role"] for m in second["messages"]] == ["user"]
    assert "tools" not in second
    # ...and the model saw the whole conversation, with the thread's tools.
    engine_request = served.scripted.requests[-1]
    assert "Weather in Paris?" in _prompt_of(served, -1)
    assert "It is sunny in Paris." in _prompt_of(served, -1)
    assert [t.name for t in engine_request.tools] == ["get_weather"]


def test_a_thread_turn_reuses_the_whole_stored_history(served: Served) -> None:
    thread = served.client.beta.messages.thread(model="m", max_tokens=24)
    turns = []
    for text, reply in [
        ("Tell me a story about a lighthouse keeper and the sea.", "Once upon a time there was."),
        ("And then what happened to the keeper?", "The keeper went home."),
        ("How did it end?", "Happily."),
    ]:
        served.scripted.enqueue(reply)
        turns.append(thread.send({"role": "user", "content": text}))
    assert [s["thread"]["type"] for s in served.seen[-3:]] == ["create", "continue", "continue"]
    for before, after in itertools.pairwise(turns):
        stored = before.usage.input_tokens + (before.usage.cache_read_input_tokens or 0)
        stored += before.usage.output_tokens
        # Everything the thread held — the previous prompt and its reply — came from the
        # cache, but for the few tokens where a reply's end meets the next turn's markup.
        assert (after.usage.cache_read_input_tokens or 0) >= stored - 8, (before.usage, after.usage)
        assert after.usage.input_tokens < 40


def test_a_streamed_thread_turn_is_continued_right_after_message_stop(served: Served) -> None:
    thread = served.client.beta.messages.thread(model="m", max_tokens=16)
    served.scripted.enqueue("first")
    with thread.stream({"role": "user", "content": "one"}) as stream:
        first = stream.get_final_message()
    served.scripted.enqueue("second")
    second = thread.send({"role": "user", "content": "two"})
    assert second.content[-1].text == "second"
    assert served.seen[-1]["thread"] == {"type": "continue", "previous_message_id": first.id}


def test_an_expired_thread_is_refused_so_the_sdk_replays_the_whole_history(
    forgetful: Served,
) -> None:
    calls.clear()
    forgetful.scripted.enqueue("Let me look." + CALL)
    forgetful.scripted.enqueue("Sunny.")
    replies = list(
        forgetful.client.beta.messages.tool_runner(
            model="m",
            max_tokens=64,
            tools=[get_weather],
            messages=[{"role": "user", "content": "Weather in Paris?"}],
        )
    )
    assert [r.stop_reason for r in replies] == ["tool_use", "end_turn"]
    kinds = [s["thread"]["type"] for s in forgetful.seen]
    # create, the refused continue, then the replay under a new thread with everything.
    assert kinds == ["create", "continue", "create"]
    assert [m["role"] for m in forgetful.seen[-1]["messages"]] == ["user", "assistant", "user"]


def _post(served: Served, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{served.server.url}/v1/messages",
        json=body,
        headers={"anthropic-beta": THREADS_BETA},
        timeout=60,
    )


BASE = {"model": "m", "max_tokens": 8}


def test_thread_errors_carry_the_codes_the_sdks_act_on(served: Served) -> None:
    missing = _post(
        served,
        {**BASE, "messages": [{"role": "user", "content": "hi"}],
         "thread": {"type": "continue", "previous_message_id": "msg_" + "0" * 24}},
    )  # fmt: skip
    # 404 `not_found_error`, as the SDKs' table pairs this code (issue 35: it was a 400).
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"
    assert missing.json()["error"]["details"]["error_code"] == "thread_not_found"
    with pytest.raises(anthropic.types.ThreadNotFoundError):
        served.client.beta.messages.create(
            **BASE,
            messages=[{"role": "user", "content": "hi"}],
            thread={"type": "continue", "previous_message_id": "msg_" + "0" * 24},
            betas=[THREADS_BETA],
        )

    served.scripted.enqueue("one")
    created = _post(
        served,
        {**BASE, "messages": [{"role": "user", "content": "a"}], "thread": {"type": "create"}},
    )
    assert created.status_code == 200
    tip = created.json()["id"]
    again = {"type": "continue", "previous_message_id": tip}
    repeated = _post(
        served,
        {**BASE, "system": "x", "messages": [{"role": "user", "content": "b"}], "thread": again},
    )
    assert repeated.status_code == 400
    details = repeated.json()["error"]["details"]
    assert details == {"error_code": "thread_unsupported_request", "unsupported": ["system"]}

    served.scripted.enqueue("two")
    assert (
        _post(
            served, {**BASE, "messages": [{"role": "user", "content": "b"}], "thread": again}
        ).status_code
        == 200
    )
    twice = _post(served, {**BASE, "messages": [{"role": "user", "content": "c"}], "thread": again})
    assert twice.status_code == 400
    assert twice.json()["error"]["details"]["error_code"] == "thread_already_continued"


def test_a_client_mistake_in_a_continue_leaves_the_thread_usable(served: Served) -> None:
    served.scripted.enqueue("one")
    tip = _post(
        served,
        {**BASE, "messages": [{"role": "user", "content": "a"}], "thread": {"type": "create"}},
    ).json()["id"]
    again = {"type": "continue", "previous_message_id": tip}
    # A tool_result for a call the conversation never made: the client's mistake, a 400.
    bad = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}],
    }
    assert _post(served, {**BASE, "messages": [bad], "thread": again}).status_code == 400
    served.scripted.enqueue("two")
    fixed = _post(served, {**BASE, "messages": [{"role": "user", "content": "b"}], "thread": again})
    assert fixed.status_code == 200, fixed.text


def test_every_thread_error_has_the_status_the_sdk_maps_its_code_from() -> None:
    """The SDK picks the error class by (status, code): each code we send must be in its
    table under the status we send it with (a code under another status is a bare error)."""
    from anthropic._error_classes import ERROR_CLASSES

    from mlxlaunch.protocol.threads import THREAD_ERRORS

    for code, (error_type, status) in THREAD_ERRORS.items():
        error_class = ERROR_CLASSES.get((status, code))
        assert error_class is not None, (code, status)
        assert error_class.__name__ == "".join(p.title() for p in code.split("_")) + "Error"
        assert status == {"not_found_error": 404, "invalid_request_error": 400}[error_type]
