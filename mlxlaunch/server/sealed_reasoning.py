"""Reasoning a stateless client carries between turns: sealed by this server, opened only here.

Codex sends `store: false` with the whole history every turn and asks for
`include: ["reasoning.encrypted_content"]`: each reasoning item then carries the model's own
reasoning as an opaque `encrypted_content`, and the next request sends it back. Opened, it
gives the reasoning exactly as it was generated, so the next prompt renders it as the turn
before did and the prefix cache serves everything up to the new input (a summary a client
trims or drops would break the prefix at the first reasoning item).

The seal is Fernet (AES-128-CBC with an HMAC-SHA256 over it, from `cryptography`): another
server cannot read it, and a changed byte fails the check. The key is this server's: kept in
mlxlaunch's home (`keys/reasoning.key`, owner-only) so sessions outlive a restart, or made
per process where there is no such file. Our seals start with `SEAL_PREFIX`; another
server's `encrypted_content` is not ours to open and is ignored, as before, while one of ours
that fails its check is the client's mistake (a 400 naming the field).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

SEAL_PREFIX = "mlxr1."
# What the client asks for to get them (Responses `include`).
INCLUDE_NAME = "reasoning.encrypted_content"


class ForgedSeal(ValueError):
    """A seal of ours whose check fails: changed, or made with another key."""


class ReasoningSeal:
    """Seals and opens reasoning text with one key."""

    def __init__(self, key: bytes | None = None) -> None:
        self._fernet = Fernet(key or Fernet.generate_key())

    @classmethod
    def kept_in(cls, path: Path) -> ReasoningSeal:
        """The seal whose key is kept at `path` (made there, owner-only, on first use; a
        per-process key where that cannot be written)."""
        with contextlib.suppress(OSError, ValueError):
            if path.is_file():
                return cls(path.read_bytes().strip())
            path.parent.mkdir(parents=True, exist_ok=True)
            key = Fernet.generate_key()
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as out:
                out.write(key)
            return cls(key)
        return cls()

    def seal(self, text: str) -> str:
        return SEAL_PREFIX + self._fernet.encrypt(text.encode()).decode("ascii")

    def open(self, content: str | None) -> str | None:
        """The reasoning in one of our seals; None for anyone else's (or none).

        Raises:
            ForgedSeal: it is ours by its prefix, but changed or made with another key.
        """
        if not content or not content.startswith(SEAL_PREFIX):
            return None
        try:
            return self._fernet.decrypt(content.removeprefix(SEAL_PREFIX).encode()).decode()
        except (InvalidToken, UnicodeDecodeError, ValueError) as exc:
            raise ForgedSeal("it does not pass this server's check") from exc
