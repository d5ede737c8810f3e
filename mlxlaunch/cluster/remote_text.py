"""Text another machine sent (a probe's answer, a remote pull's output), made safe to show.

What a host answers is data: it reaches this terminal only through `printable`, which bounds
its length and writes every character that is not printable (escape sequences, carriage
returns, bidirectional overrides) as a visible escape, so no host can move the cursor, recolour
or rewrite what the user reads. Rich markup is left to the printer: the CLI prints such text as
plain `Text`, never as markup.
"""

from __future__ import annotations

MAX_REMOTE_CHARS = 2000  # a host's error line or version string is far shorter


def printable(text: str, limit: int = MAX_REMOTE_CHARS) -> str:
    """`text` with its unprintable characters escaped (`\\x1b`), at most `limit` of its
    characters (an ellipsis says it was cut)."""
    shown = text[:limit]
    if not shown.isprintable():
        shown = "".join(c if c.isprintable() else _escaped(c) for c in shown)
    return shown + ("…" if len(text) > limit else "")


def _escaped(char: str) -> str:
    return char.encode("unicode_escape").decode("ascii")
