"""Tool-call ids between Anthropic clients and model families.

Clients name calls `toolu_…` and send those ids back in the history; templates and parsers
often want their own form: Mistral's nine alphanumerics (its template raises on anything
else), Kimi's `functions.Name:N` (its parser reads only that), OpenAI's `call_…`. Both
directions are pure functions, so a history renders to the same tokens on every turn and the
prefix cache keeps hitting:

- a call the model wrote with its own id (`[CALL_ID]a1b2c3d4e`, `functions.Bash:0`) goes to the
  client as `toolu_mx` + the id in hex, and comes back as exactly the id the model wrote;
- any other id (a random `toolu_…`, ids from another server) maps to a family form derived
  from the id itself (a hash) or from the call's place in the conversation.

Hex keeps the client-side id inside the `[A-Za-z0-9_-]` alphabet Anthropic ids use.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string

# How a family's template and parser want ids (`store.dialects.IdStyle`):
# "any": as they come; "alnum9": exactly nine ASCII letters or digits (Mistral);
# "functions_index": `functions.<name>:<n>`, n counting the calls of the conversation (Kimi).
from mlxlaunch.store.dialects import IdStyle

__all__ = ["IdStyle", "client_tool_id", "family_tool_id", "model_written_id", "new_tool_use_id"]

ENCODED_PREFIX = "toolu_mx"
_ALPHABET = string.ascii_letters + string.digits
_ALNUM9 = re.compile(r"[A-Za-z0-9]{9}")
_FUNCTIONS_INDEX = re.compile(r"functions\.[^:\s]+:\d+")


def new_tool_use_id() -> str:
    """A fresh Anthropic-style tool-use id: `toolu_` and 24 random base62 characters."""
    return "toolu_" + "".join(secrets.choice(_ALPHABET) for _ in range(24))


def client_tool_id(model_id: str | None) -> str:
    """The id a client sees for a call the model wrote with `model_id` (None or empty: the
    model wrote no id, so a fresh one)."""
    if not model_id:
        fresh = new_tool_use_id()
        while fresh.startswith(ENCODED_PREFIX):  # a random id must not read as one encoded
            fresh = new_tool_use_id()
        return fresh
    return ENCODED_PREFIX + model_id.encode("utf-8").hex()


def model_written_id(tool_use_id: str) -> str | None:
    """The id the model wrote, when `tool_use_id` came from `client_tool_id`; else None."""
    if not tool_use_id.startswith(ENCODED_PREFIX):
        return None
    digits = tool_use_id[len(ENCODED_PREFIX) :]
    try:
        text = bytes.fromhex(digits).decode("utf-8")
    except ValueError:
        return None
    return text or None


def fits_style(model_id: str, style: IdStyle) -> bool:
    """Whether `model_id` already has the form `style` asks for."""
    if style == "alnum9":
        return _ALNUM9.fullmatch(model_id) is not None
    if style == "functions_index":
        return _FUNCTIONS_INDEX.fullmatch(model_id) is not None
    return True


def family_tool_id(tool_use_id: str, style: IdStyle, *, name: str, index: int) -> str:
    """The id to render for the history call `tool_use_id` (the `index`-th call of the
    conversation, 0-based, calling `name`) in the family's form.

    The id the model itself wrote wins when it fits; otherwise the form is derived from
    `tool_use_id` (alnum9) or from the call's place (functions_index), never at random."""
    written = model_written_id(tool_use_id)
    if written is not None and fits_style(written, style):
        return written
    if style == "alnum9":
        digest = hashlib.sha256(tool_use_id.encode("utf-8")).digest()
        return "".join(_ALPHABET[b % len(_ALPHABET)] for b in digest[:9])
    if style == "functions_index":
        return f"functions.{name}:{index}"
    return written if written is not None else tool_use_id
