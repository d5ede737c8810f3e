"""A vision model sees the picture, through the real server and both vendors' SDKs: Anthropic
image blocks (a user's, and one inside a tool result, as Claude Code's Read returns a PNG),
OpenAI `image_url` and `input_image` parts; count_tokens counts the image's tokens exactly;
a repeated image is read from the prefix cache, a changed one is not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import Served, serve
from pictures import READ, anthropic_block, data_url, png, png_pixels, read_picture_turns

from mlxlaunch.server.images import IMAGE_PLACEHOLDER
from mlxlaunch.testing import ensure_test_model

pytestmark = pytest.mark.slow  # serves a model

pytest.importorskip("mlx_vlm")  # the `vision` extra

PLACED = "<|vision_start|><|image_pad|><|vision_end|>"


def _picture(changed: bool = False) -> bytes:
    rows = [[(30 * x % 256, 50 * y % 256, 90) for x in range(112)] for y in range(56)]
    if changed:
        rows[20][31] = (255, 255, 255)
    return png_pixels(rows)


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    stores = tmp_path_factory.mktemp("vision")
    with serve(ensure_test_model("tiny-vision"), settings={"threads_dir": stores}) as served:
        yield served


def _user(*blocks: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(blocks)}]


def test_a_users_image_is_seen_and_counted_exactly(vision_model: Served) -> None:
    client = vision_model.anthropic
    text = {"type": "text", "text": "what is on this picture?"}
    messages = _user(anthropic_block(png(56, 84)), text)
    counted = client.messages.count_tokens(model="m", messages=messages)
    vision_model.scripted.enqueue("a picture")
    reply = client.messages.create(model="m", max_tokens=5, messages=messages)
    assert reply.content[0].text == "a picture"  # type: ignore[union-attr]
    assert PLACED + "\n\nwhat is on this picture?" in vision_model.rendered()
    assert vision_model.scripted.requests[-1].images[0].data == png(56, 84)
    usage = reply.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
    # The image's run: 56x84 pixels are 2x3 merged 28-pixel patches.
    larger = client.messages.count_tokens(
        model="m", messages=_user(anthropic_block(png(112, 168)), text)
    )
    assert larger.input_tokens - counted.input_tokens == 4 * 6 - 2 * 3


def test_an_image_a_tool_returned_is_the_image_itself(vision_model: Served) -> None:
    messages = read_picture_turns(png(56, 56))
    vision_model.scripted.enqueue("a blue square")
    reply = vision_model.anthropic.messages.create(
        model="m", max_tokens=20, messages=messages, tools=[READ]
    )
    assert reply.content[0].text == "a blue square"  # type: ignore[union-attr]
    rendered = vision_model.rendered()
    assert "<tool_response>\na.png\n\n" + PLACED in rendered
    assert IMAGE_PLACEHOLDER not in rendered


def test_a_repeated_image_is_read_from_the_cache_and_a_changed_one_is_not(
    vision_model: Served,
) -> None:
    client = vision_model.anthropic
    text = {"type": "text", "text": "describe it in detail, every part of it, carefully " * 6}

    def ask(picture: bytes) -> Any:
        vision_model.scripted.enqueue("ok")
        return client.messages.create(
            model="m", max_tokens=3, messages=_user(anthropic_block(picture), text)
        ).usage

    first, again, other = ask(_picture()), ask(_picture()), ask(_picture(changed=True))
    total = first.input_tokens + (first.cache_read_input_tokens or 0)
    assert (again.cache_read_input_tokens or 0) >= total - 2
    # Only the turn's opening is shared: the run differs from the image's first token on.
    assert (other.cache_read_input_tokens or 0) < 8
    # The engine's own stats say the same of these three requests.
    records = vision_model.engine.stats().recent[-3:]
    assert [r.prompt_tokens for r in records] == [total] * 3
    assert [r.cached_tokens for r in records] == [
        first.cache_read_input_tokens or 0,
        again.cache_read_input_tokens,
        other.cache_read_input_tokens or 0,
    ]


def test_openai_image_parts_are_seen(vision_model: Served) -> None:
    client = vision_model.openai
    part = {"type": "image_url", "image_url": {"url": data_url(png(56, 56))}}
    vision_model.scripted.enqueue("seen in chat")
    answer = client.chat.completions.create(
        model="m", max_tokens=5, messages=[{"role": "user", "content": [part]}]
    )
    assert answer.choices[0].message.content == "seen in chat"
    assert PLACED in vision_model.rendered()
    image = {"type": "input_image", "image_url": data_url(png(56, 56))}
    vision_model.scripted.enqueue("seen in responses")
    reply = client.responses.create(
        model="m", max_output_tokens=5, input=[{"role": "user", "content": [image]}]
    )
    assert reply.output_text == "seen in responses"
    assert PLACED in vision_model.rendered()
    assert vision_model.scripted.requests[-1].images[0].media_type == "image/png"


def test_the_limits_still_hold(vision_model: Served, tmp_path: Path) -> None:
    import anthropic

    url = {"type": "image", "source": {"type": "url", "url": "https://e.com/a.png"}}
    with pytest.raises(anthropic.BadRequestError, match="image URLs are off"):
        vision_model.anthropic.messages.create(model="m", max_tokens=5, messages=_user(url))
