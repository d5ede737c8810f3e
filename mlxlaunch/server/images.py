"""Images in requests: one policy for the three APIs' image parts, and their limits.

A text-only model refuses an image a user sent (a 400 that names a vision model) and reads a
placeholder where a tool returned one; a vision model's images must keep the limits.

Each API's mapping turns its own image part into an `ImageRef` (where it stands in the body,
and its source) and hands it to `ImageCheck`, which applies the rules in one place: base64
data that decodes, a media type the Messages API allows, bytes and pixels under the limits,
not too many images in one request; URL and file sources are refused (this local server
fetches nothing on a client's behalf, and has no Files API). Pixel sizes come from the
image's own header (PNG, JPEG, GIF, WebP), so no imaging library is needed to check them.
"""

from __future__ import annotations

import base64
import binascii
import struct
from dataclasses import dataclass, field
from typing import Any

from mlxlaunch.engine.types import ImageInput, InvalidRequest, image_slot

IMAGE_PLACEHOLDER = "[image omitted]"
MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")  # the Messages API's
MIB = 1024 * 1024


@dataclass(frozen=True)
class ImageLimits:
    """What one request's images may hold.

    Args:
        max_bytes: largest image, decoded (the Messages API takes 5 MB; screenshots of a
            5K display run to ~10 MB as PNG).
        max_pixels: most pixels in one image (an 8K screenshot); vision processors resize
            anything larger anyway, so more would only cost time.
        max_images: most images in one request, tool results included.
    """

    max_bytes: int = 20 * MIB
    max_pixels: int = 7680 * 4320
    max_images: int = 32


@dataclass(frozen=True)
class ImageAccess:
    """Whether the loaded model sees images, the limits, and a vision model to name."""

    sees_images: bool = False
    limits: ImageLimits = field(default_factory=ImageLimits)
    vision_model: str | None = None  # a model alias to suggest when refusing (launch fills it)


TEXT_ONLY = ImageAccess()


@dataclass(frozen=True)
class ImageRef:
    """One image part of a request: the field its source is (`messages.0.content.1.source`)
    and where its bytes are. `kind` is "base64" (with `data`), "url" (with `url`) or "file"."""

    where: str
    kind: str
    media_type: str | None = None
    data: str = ""
    url: str = ""
    in_tool_result: bool = False


@dataclass(frozen=True)
class CheckedImage:
    """An image that passed: its bytes and size."""

    media_type: str
    data: bytes
    width: int
    height: int


def anthropic_image(where: str, source: dict[str, Any], *, in_tool_result: bool) -> ImageRef:
    """The `ImageRef` of a Messages API `image` block's `source`."""
    kind = str(source.get("type") or "")
    media_type = source.get("media_type")
    data = source.get("data")
    url = source.get("url")
    return ImageRef(
        where=f"{where}.source",
        kind=kind if kind in ("base64", "url", "file") else kind or "?",
        media_type=media_type if isinstance(media_type, str) else None,
        data=data if isinstance(data, str) else "",
        url=url if isinstance(url, str) else "",
        in_tool_result=in_tool_result,
    )


def url_image(where: str, url: str | None, *, in_tool_result: bool = False) -> ImageRef:
    """The `ImageRef` of an OpenAI image URL (`data:image/png;base64,…` or `https://…`); no
    URL (an OpenAI `file_id` part) is a file source."""
    if not url:
        return ImageRef(where=where, kind="file", in_tool_result=in_tool_result)
    if url.startswith("data:"):
        head, _, data = url[5:].partition(",")
        media_type, _, encoding = head.partition(";")
        kind = "base64" if encoding == "base64" else "data-url"
        return ImageRef(where, kind, media_type or None, data, in_tool_result=in_tool_result)
    return ImageRef(where=where, kind="url", url=url, in_tool_result=in_tool_result)


class ImageCheck:
    """The images of one request, checked as the mapping meets them."""

    def __init__(self, access: ImageAccess) -> None:
        self.access = access
        self.count = 0
        self.images: list[ImageInput] = []  # a vision model's, as their slots name them

    def placeholder(self, image: ImageRef) -> str:
        """The text that stands for `image` in the engine's messages: a placeholder for a
        text-only model, the image's slot (`engine.types.image_slot`) for a vision model,
        its bytes kept in `images`.

        Raises:
            InvalidRequest: a user's image to a model without vision, or an image that
                breaks the rules (naming the field).
        """
        if not self.access.sees_images:
            if not image.in_tool_result:
                raise InvalidRequest(self._no_vision(image.where))
            # A tool chose to return it (Claude Code's Read on a PNG): refusing would wedge
            # the conversation, since every later request carries the same result.
            return IMAGE_PLACEHOLDER
        checked = self.check(image)
        # The image itself, where it stands (the user's or a tool's alike).
        self.images.append(ImageInput(checked.media_type, checked.data))
        return image_slot(len(self.images) - 1)

    def check(self, image: ImageRef) -> CheckedImage:
        """`image`'s bytes and size, once it keeps every rule.

        Raises:
            InvalidRequest: naming the field that breaks a rule.
        """
        limits = self.access.limits
        self.count += 1
        if self.count > limits.max_images:
            raise InvalidRequest(
                f"{image.where}: too many images in one request (at most {limits.max_images})"
            )
        where = image.where
        if image.kind == "url":
            raise InvalidRequest(
                f"{where}: image URLs are off on this local server (it does not fetch from "
                "the network for a client); send the image as base64 data "
                '({"type": "base64", "media_type": "image/png", "data": …} or a '
                "data:image/png;base64,… URL)"
            )
        if image.kind == "file":
            raise InvalidRequest(
                f"{where}: file sources need a Files API this server does not have; send the "
                "image as base64 data"
            )
        if image.kind != "base64":
            raise InvalidRequest(f"{where}: unsupported image source {image.kind!r}; use base64")
        if image.media_type not in MEDIA_TYPES:
            raise InvalidRequest(
                f"{where}.media_type: {image.media_type!r} is not one of {', '.join(MEDIA_TYPES)}"
            )
        # base64 grows data by 4/3: refuse a huge one before decoding it.
        if len(image.data) > (limits.max_bytes + 2) // 3 * 4 + 4:
            raise InvalidRequest(self._too_big(where, limits.max_bytes))
        try:
            data = base64.b64decode(image.data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidRequest(f"{where}.data: not valid base64 ({exc})") from exc
        if len(data) > limits.max_bytes:
            raise InvalidRequest(self._too_big(where, limits.max_bytes))
        size = image_size(data, image.media_type)
        if size is None:
            raise InvalidRequest(
                f"{where}.data: not a readable {image.media_type} image (its header is not one)"
            )
        width, height = size
        if width * height > limits.max_pixels:
            raise InvalidRequest(
                f"{where}.data: the image is {width}x{height} = {width * height:,} pixels, "
                f"more than the {limits.max_pixels:,} allowed; scale it down"
            )
        return CheckedImage(image.media_type, data, width, height)

    def _no_vision(self, where: str) -> str:
        model = self.access.vision_model
        pull = (
            f"pull one (mlx models pull {model}) and serve it" if model else "serve a vision model"
        )
        return (
            f"{where}: this model does not accept images (it has no vision); to send "
            f"images, {pull}, or send the text instead"
        )

    @staticmethod
    def _too_big(where: str, max_bytes: int) -> str:
        return f"{where}.data: the image is larger than {max_bytes // MIB} MiB; scale it down"


def image_size(data: bytes, media_type: str) -> tuple[int, int] | None:
    """(width, height) from the header of a PNG, JPEG, GIF or WebP image; None if the bytes
    are not an image of `media_type`."""
    try:
        if media_type == "image/png":
            return _png_size(data)
        if media_type == "image/gif":
            return _gif_size(data)
        if media_type == "image/webp":
            return _webp_size(data)
        if media_type == "image/jpeg":
            return _jpeg_size(data)
    except struct.error:
        return None
    return None


def _png_size(data: bytes) -> tuple[int, int] | None:
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return _positive(width, height)


def _gif_size(data: bytes) -> tuple[int, int] | None:
    if data[:6] not in (b"GIF87a", b"GIF89a"):
        return None
    width, height = struct.unpack("<HH", data[6:10])
    return _positive(width, height)


def _webp_size(data: bytes) -> tuple[int, int] | None:
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return None
    chunk = data[12:16]
    if chunk == b"VP8 ":  # lossy: the frame header after a 3-byte tag and start code
        width, height = struct.unpack("<HH", data[26:30])
        return _positive(width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L":  # lossless: 14-bit sizes minus one, after the signature byte
        bits = int.from_bytes(data[21:25], "little")
        return _positive((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X":  # extended: 24-bit canvas sizes minus one
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return _positive(width, height)
    return None


# JPEG start-of-frame markers (baseline, progressive, …); C4, C8 and CC are other segments.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    if data[:2] != b"\xff\xd8":
        return None
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker in _SOF:
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return _positive(width, height)
        at += 2 + length
    return None


def _positive(width: int, height: int) -> tuple[int, int] | None:
    return (width, height) if width > 0 and height > 0 else None
