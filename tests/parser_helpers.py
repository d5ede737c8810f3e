"""Helpers shared by the output parser tests."""

from __future__ import annotations

from collections.abc import Iterable


def splits(output: str) -> Iterable[list[str]]:
    """The whole output at once, one character at a time, and every two-piece split."""
    yield [output]
    yield list(output)
    for cut in range(1, len(output)):
        yield [output[:cut], output[cut:]]
