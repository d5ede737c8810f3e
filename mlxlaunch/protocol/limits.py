"""Bounds on what one request may ask for, and the rule for the `model` field.

The server runs on the user's own machine, so every limit here is about staying up and
responsive under hostile or broken input, not about quotas: each is far above what Claude Code
sends (measured: ~100 tools, a few hundred messages, schemas nested < 15 deep, max_tokens
≤ 64k), and each violation is a 400 `invalid_request_error` that names the field.

The body size limit (32 MiB, the Anthropic API's own) is enforced by the HTTP layer as bytes
arrive; this module only bounds the shape of what was sent.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_JSON_DEPTH = 64  # objects/arrays inside each other; tool schemas nest ~10 deep
MAX_MESSAGES = 100_000  # the Anthropic API's own limit
MAX_BLOCKS = 10_000  # content blocks in one message, system blocks, tool_result parts
MAX_TOOLS = 1_000
MAX_STOP_SEQUENCES = 256
MAX_STOP_SEQUENCE_CHARS = 1_000  # the parser holds back this many characters of output
MAX_NAME_CHARS = 256  # model ids, tool names, tool_use ids
MAX_OUTPUT_TOKENS = 1 << 20  # max_tokens and budget_tokens; the engine clamps to the window
MAX_TOP_K = 1_000

_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:/")
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:")

MODEL_ID_RULE = (
    "model must be a model id such as 'claude-sonnet-4-5' or 'org/name' (any such id is served "
    "by the loaded model); paths and URLs are refused: a request never selects what is loaded"
)


class RequestLimitError(ValueError):
    """A request exceeds one of the bounds above; the message says which and by how much."""


def check_model_id(value: str) -> str:
    """Return `value` if it is a plain model id; raise ValueError if it looks like a path/URL.

    Plain ids are what clients send (`claude-haiku-4-5-20251001`,
    `mlx-community/Qwen3-4B-4bit`, `qwen3:8b`). Refused: anything with a URL scheme, a leading
    `/ . ~ \\` or drive letter, a backslash, more than one `/`, an empty or dot-led segment
    around the `/`, control characters, or more than MAX_NAME_CHARS characters.
    """
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"model id is longer than {MAX_NAME_CHARS} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError("model id contains control characters")
    looks_like_path = (
        "://" in value
        or _URL_SCHEME.match(value) is not None
        or _WINDOWS_DRIVE.match(value) is not None
        or value.startswith(("/", ".", "~", "\\"))
        or "\\" in value
    )
    if not looks_like_path and "/" in value:
        segments = value.split("/")
        looks_like_path = len(segments) > 2 or any(not s or s.startswith(".") for s in segments)
    if looks_like_path:
        raise ValueError(MODEL_ID_RULE)
    return value


def load_request_json(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse a request body, refusing nesting deeper than `max_depth`.

    Raises json.JSONDecodeError / UnicodeDecodeError for bad JSON and RequestLimitError for
    too-deep input (including input so deep that the parser itself gives up) and for values
    Python will not convert (an integer literal over `sys.get_int_max_str_digits()` digits).
    """
    try:
        value = json.loads(raw)
    except RecursionError as exc:
        raise RequestLimitError(
            f"request body is nested too deeply (more than {max_depth} levels)"
        ) from exc
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise
    except ValueError as exc:  # valid JSON Python refuses to hold: a 4,300+ digit integer
        raise RequestLimitError(f"request body holds a value out of range: {exc}") from exc
    depth = json_depth(value, stop_after=max_depth)
    if depth > max_depth:
        raise RequestLimitError(f"request body is nested too deeply (more than {max_depth} levels)")
    return value


def json_depth(value: Any, *, stop_after: int | None = None) -> int:
    """Nesting depth of parsed JSON (a scalar is 0, `[]` is 1); iterative, so deep input is safe.

    With `stop_after`, returns as soon as the depth is known to exceed it.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if stop_after is not None and deepest > stop_after:
                return deepest
        stack.extend((child, depth) for child in children if isinstance(child, dict | list))
    return deepest


def plain_model_id(name: str) -> str:
    """A model id clients may send for a model named `name` on the command line: the name
    itself when it is a plain id, else the last part of the path (`./models/qwen` → `qwen`)."""
    try:
        return check_model_id(name)
    except ValueError:
        last = name.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lstrip(".~")
        return last[:MAX_NAME_CHARS] or "local-model"
