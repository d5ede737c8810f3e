"""A text-only model never breaks on a picture, through the real server and both vendors'
SDKs: a user's image is a 400 naming the field and a vision model to pull (Messages,
count_tokens, Chat Completions, Responses); an image a tool returned reaches the model as a
placeholder and the turn is answered."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
from engine_helpers import Served, serve
from pictures import READ, anthropic_block, data_url, png, read_picture_turns

from mlxlaunch.server.images import IMAGE_PLACEHOLDER

pytestmark = pytest.mark.slow  # serves a model

PICTURE = png(4, 3)


@pytest.fixture(scope="module")
def text_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    stores = tmp_path_factory.mktemp("images")
    settings = {"threads_dir": stores / "threads", "vision_model": "qwen2.5-vl-7b"}
    with serve(tiny_model_dir, settings=settings) as served:
        yield served


def test_a_users_image_is_a_400_naming_the_field_and_a_vision_model(text_model: Served) -> None:
    user = [{"role": "user", "content": [{"type": "text", "text": "?"}, anthropic_block(PICTURE)]}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        text_model.anthropic.messages.create(model="m", max_tokens=5, messages=user)
    error = caught.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("messages.0.content.1.source: this model does not")
    assert "mlx models pull qwen2.5-vl-7b" in error["message"]
    with pytest.raises(anthropic.BadRequestError, match=r"qwen2\.5-vl-7b"):
        text_model.anthropic.messages.count_tokens(model="m", messages=user)


def test_an_image_a_tool_returned_reaches_the_model_as_a_placeholder(text_model: Served) -> None:
    messages = read_picture_turns(PICTURE)
    text_model.scripted.enqueue("a blue picture")
    reply = text_model.anthropic.messages.create(
        model="m", max_tokens=20, messages=messages, tools=[READ]
    )
    assert reply.content[0].text == "a blue picture"  # type: ignore[union-attr]
    assert IMAGE_PLACEHOLDER in text_model.rendered()
    counted = text_model.anthropic.messages.count_tokens(model="m", messages=messages, tools=[READ])
    assert counted.input_tokens > 0


def test_openai_image_parts_are_refused_for_users_and_read_from_tools(text_model: Served) -> None:
    client = text_model.openai
    part = {"type": "image_url", "image_url": {"url": data_url(PICTURE)}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": [part]}]
        )
    assert "messages.0.content.0.image_url.url: this model does not" in str(caught.value)
    assert "qwen2.5-vl-7b" in str(caught.value)
    image = {"type": "input_image", "image_url": data_url(PICTURE)}
    with pytest.raises(openai.BadRequestError, match=r"input\.0\.content\.0\.image_url"):
        client.responses.create(model="m", input=[{"role": "user", "content": [image]}])
    # Codex's view_image: the picture comes back as the call's output.
    text_model.scripted.enqueue("seen")
    answer = client.responses.create(
        model="m",
        max_output_tokens=20,
        input=[
            {"role": "user", "content": "look at a.png"},
            {"type": "function_call", "call_id": "call_v", "name": "view_image", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_v", "output": [image]},
        ],
        tools=[{"type": "function", "name": "view_image", "parameters": {"type": "object"}}],
    )
    assert answer.output_text == "seen"
    assert IMAGE_PLACEHOLDER in text_model.rendered()
