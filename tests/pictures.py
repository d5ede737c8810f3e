"""Real image files for tests, written without an imaging library: PNG (zlib-compressed RGB
rows), and the headers of GIF, JPEG and WebP files of a given size."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any


def png(width: int, height: int, rgb: tuple[int, int, int] = (40, 90, 200)) -> bytes:
    """A `width`×`height` PNG of one colour, with pixel (0, 0) as given by `rgb` too."""
    return png_pixels([[rgb] * width for _ in range(height)])


def png_pixels(rows: list[list[tuple[int, int, int]]]) -> bytes:
    """A PNG of these RGB rows (all of one length)."""
    height, width = len(rows), len(rows[0])
    raw = b"".join(b"\x00" + bytes(c for pixel in row for c in pixel) for row in rows)

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def gif_header(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00;"


def jpeg_header(width: int, height: int) -> bytes:
    """SOI, an APP0 segment, then a baseline SOF0 carrying the size."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


def webp_lossless_header(width: int, height: int) -> bytes:
    bits = (width - 1) | ((height - 1) << 14)
    body = b"VP8L" + struct.pack("<I", 5) + b"\x2f" + struct.pack("<I", bits)
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def anthropic_block(data: bytes, media_type: str = "image/png") -> dict[str, Any]:
    """A Messages API `image` block holding `data` as base64."""
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media_type, "data": b64(data)},
    }


# Claude Code's Read tool, and its call on a picture.
READ = {"name": "Read", "input_schema": {"type": "object"}}
READ_CALL = {"type": "tool_use", "id": "toolu_r", "name": "Read", "input": {"file_path": "a.png"}}


def read_picture_turns(data: bytes) -> list[dict[str, Any]]:
    """A conversation whose last turn is the Read tool's result: "a.png" and the PNG `data`
    (what Claude Code sends after reading an image file)."""
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_r",
        "content": [{"type": "text", "text": "a.png"}, anthropic_block(data)],
    }
    return [
        {"role": "user", "content": "read a.png"},
        {"role": "assistant", "content": [READ_CALL]},
        {"role": "user", "content": [result]},
    ]


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{b64(data)}"
