"""Images in requests (server/images.py): the one policy the three APIs' mappings share.

A text-only model refuses a user's image with a 400 naming the field and a vision model to
pull, and reads a placeholder where a tool returned one; a vision model's images keep the
limits (bytes, pixels, images per request); URL and file sources are refused with a 400
saying what to send instead. Image sizes come from real headers (checked against Pillow).
"""

from __future__ import annotations

from typing import Any

import pytest
from pictures import (
    anthropic_block,
    b64,
    data_url,
    gif_header,
    jpeg_header,
    png,
    png_pixels,
    webp_lossless_header,
)

from mlxlaunch.engine.types import ImageInput, InvalidRequest, image_slot
from mlxlaunch.protocol.openai_chat import ChatCompletionRequest
from mlxlaunch.protocol.openai_responses import ResponsesRequest
from mlxlaunch.protocol.requests import MessagesRequest
from mlxlaunch.server import chat_mapping, mapping, responses_mapping
from mlxlaunch.server.images import (
    IMAGE_PLACEHOLDER,
    TEXT_ONLY,
    ImageAccess,
    ImageCheck,
    ImageLimits,
    anthropic_image,
    image_size,
    url_image,
)

VISION = ImageAccess(sees_images=True)
TEXT_NAMING = ImageAccess(vision_model="qwen2.5-vl-7b")
CALL = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a.png"}}


def _anthropic(content: list[Any], access: ImageAccess = TEXT_NAMING) -> Any:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": content}]}
    return mapping.to_generation_request(MessagesRequest.model_validate(body), images=access)


def _read_result(parts: list[Any], access: ImageAccess = TEXT_NAMING) -> Any:
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "look at a.png"},
            {"role": "assistant", "content": [CALL]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": parts}],
            },
        ],
    }
    return mapping.to_generation_request(MessagesRequest.model_validate(body), images=access)


# --- sizes from headers ----------------------------------------------------------------------


def test_sizes_are_read_from_each_formats_header() -> None:
    assert image_size(png(7, 3), "image/png") == (7, 3)
    assert image_size(gif_header(5, 6), "image/gif") == (5, 6)
    assert image_size(jpeg_header(640, 480), "image/jpeg") == (640, 480)
    assert image_size(webp_lossless_header(300, 200), "image/webp") == (300, 200)
    assert image_size(png(7, 3), "image/jpeg") is None  # a PNG labelled JPEG is no JPEG
    assert image_size(b"\x89PNG\r\n", "image/png") is None  # truncated
    assert image_size(b"", "image/webp") is None


def test_sizes_agree_with_pillow_for_what_it_writes() -> None:
    image_module = pytest.importorskip("PIL.Image")  # comes with the vision extra
    import io

    for fmt, options in [
        ("PNG", {}),
        ("JPEG", {}),
        ("JPEG", {"progressive": True}),
        ("GIF", {}),
        ("WEBP", {}),
        ("WEBP", {"lossless": True}),
    ]:
        out = io.BytesIO()
        image_module.new("RGB", (123, 45)).save(out, fmt, **options)
        assert image_size(out.getvalue(), f"image/{fmt.lower()}") == (123, 45), (fmt, options)


# --- text-only models ------------------------------------------------------------------------


def test_a_users_image_to_a_text_model_is_a_400_naming_the_field_and_a_vision_model() -> None:
    with pytest.raises(InvalidRequest) as caught:
        _anthropic([{"type": "text", "text": "what is this?"}, anthropic_block(png(2, 2))])
    message = str(caught.value)
    assert message.startswith("messages.0.content.1.source: this model does not accept images")
    assert "mlx models pull qwen2.5-vl-7b" in message
    with pytest.raises(InvalidRequest, match="serve a vision model"):  # none to name
        _anthropic([anthropic_block(png(2, 2))], TEXT_ONLY)


def test_an_image_in_a_tool_result_is_a_placeholder_for_a_text_model() -> None:
    gen = _read_result([{"type": "text", "text": "a.png:"}, anthropic_block(png(2, 2))])
    assert gen.messages[-1].role == "tool"
    assert gen.messages[-1].content == f"a.png:\n\n{IMAGE_PLACEHOLDER}"
    # Even one a vision model would refuse (a URL, junk data): a text model never reads it.
    junk = {"type": "image", "source": {"type": "url", "url": "https://example.com/x.png"}}
    assert _read_result([junk]).messages[-1].content == IMAGE_PLACEHOLDER


def test_openai_chat_images_are_refused_for_users_and_placeholders_from_tools() -> None:
    part = {"type": "image_url", "image_url": {"url": data_url(png(2, 2))}}
    user = {"role": "user", "content": [{"type": "text", "text": "see"}, part]}
    with pytest.raises(InvalidRequest) as caught:
        chat_mapping.conversation(
            ChatCompletionRequest.model_validate({"model": "m", "messages": [user]}).messages,
            ImageCheck(TEXT_NAMING),
        )
    assert str(caught.value).startswith("messages.0.content.1.image_url.url: this model does")
    assert "qwen2.5-vl-7b" in str(caught.value)
    call = {"id": "call_1", "type": "function", "function": {"name": "view", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": [part]},
    ]
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": messages})
    out = chat_mapping.conversation(request.messages, ImageCheck(TEXT_NAMING))
    assert out[-1].role == "tool" and out[-1].content == IMAGE_PLACEHOLDER


def test_openai_responses_input_images_likewise() -> None:
    image = {"type": "input_image", "image_url": data_url(png(2, 2))}
    names = responses_mapping.ToolNames()
    user = ResponsesRequest.model_validate(
        {"model": "m", "input": [{"role": "user", "content": [image]}]}
    )
    with pytest.raises(InvalidRequest) as caught:
        responses_mapping.conversation(user.items, names, ImageCheck(TEXT_NAMING))
    assert str(caught.value).startswith("input.0.content.0.image_url: this model does not")
    # Codex's view_image answers its call with the picture: a placeholder, not a 400.
    items = [
        {"role": "user", "content": "look"},
        {"type": "function_call", "call_id": "call_1", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": [image]},
    ]
    request = ResponsesRequest.model_validate({"model": "m", "input": items})
    out = responses_mapping.conversation(request.items, names, ImageCheck(TEXT_NAMING))
    assert out[-1].role == "tool" and out[-1].content == IMAGE_PLACEHOLDER


# --- a vision model's rules ------------------------------------------------------------------


def _check(image: Any, access: ImageAccess = VISION) -> Any:
    return ImageCheck(access).check(image)


def test_a_good_image_passes_with_its_bytes_and_size() -> None:
    data = png_pixels([[(1, 2, 3), (4, 5, 6)], [(7, 8, 9), (0, 0, 0)]])
    checked = _check(url_image("x", data_url(data)))
    assert (checked.media_type, checked.data, checked.width, checked.height) == (
        "image/png",
        data,
        2,
        2,
    )
    # A vision model's request holds the image itself, its slot where it stood.
    request = _anthropic([anthropic_block(data)], VISION)
    assert request.messages[0].content == image_slot(0)
    assert request.images == [ImageInput("image/png", data)]


@pytest.mark.parametrize(
    ("source", "field", "words"),
    [
        ({"type": "url", "url": "https://e.com/a.png"}, "source", "image URLs are off"),
        ({"type": "file", "file_id": "file_1"}, "source", "Files API"),
        ({"type": "base64", "media_type": "image/bmp", "data": "AA=="}, "source.media_type", "bmp"),
        ({"type": "base64", "media_type": "image/png", "data": "%%%"}, "source.data", "base64"),
        ({"type": "base64", "media_type": "image/png", "data": b64(b"x" * 40)}, "source.data",
         "not a readable image/png"),
        ({"type": "magic"}, "source", "unsupported image source"),
    ],
)  # fmt: skip
def test_bad_sources_are_400s_naming_the_field(
    source: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _anthropic([{"type": "text", "text": "x"}, {"type": "image", "source": source}], VISION)
    assert str(caught.value).startswith(f"messages.0.content.1.{field}: ")
    assert words in str(caught.value)


def test_url_refusal_says_what_to_send_instead() -> None:
    with pytest.raises(InvalidRequest) as caught:
        _check(url_image("input.0.content.0.image_url", "https://e.com/a.png"))
    assert "send the image as base64" in str(caught.value)
    assert "data:image/png;base64" in str(caught.value)


def test_limits_on_bytes_pixels_and_count_name_the_field() -> None:
    small = ImageAccess(sees_images=True, limits=ImageLimits(max_bytes=200, max_pixels=100))
    with pytest.raises(InvalidRequest, match=r"^a\.source\.data: the image is larger than"):
        _check(anthropic_image("a", anthropic_block(b"\x89PNG" + b"x" * 600)["source"],
                               in_tool_result=False), small)  # fmt: skip
    with pytest.raises(InvalidRequest, match=r"^a\.source\.data: the image is 11x10 = 110 pix"):
        _check(anthropic_image("a", anthropic_block(png(11, 10))["source"], in_tool_result=False),
               small)  # fmt: skip
    three = ImageAccess(sees_images=True, limits=ImageLimits(max_images=2))
    with pytest.raises(InvalidRequest) as caught:
        _read_result([anthropic_block(png(1, 1))] * 3, three)  # tool results count too
    assert str(caught.value).startswith("messages.2.content.0.content.2.source: too many images")
    assert len(_read_result([anthropic_block(png(1, 1))] * 2, three).messages) == 3
